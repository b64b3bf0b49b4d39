// The C side of the binding: a table of function pointers that
// calls_cgo.go fills with dlsym, and one trampoline per call that casts a
// slot to the runtime function's C type and calls it, selecting the device
// first where the call needs one. Only calls_cgo.go includes this file.

#ifndef UMBP_TRAMPOLINES_H
#define UMBP_TRAMPOLINES_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { UMBP_VENDOR_HIP = 1, UMBP_VENDOR_CUDA = 2 };

// Slots of the function table, numbered as loader.go's fn constants are
// (calls_cgo.go fails to compile where they disagree); loader.go's symbol
// table names each slot's symbol per vendor.
enum {
	UMBP_FN_INIT,
	UMBP_FN_RUNTIME_VERSION,
	UMBP_FN_DEVICE_COUNT,
	UMBP_FN_SET_DEVICE,
	UMBP_FN_GET_DEVICE,
	UMBP_FN_MALLOC,
	UMBP_FN_FREE,
	UMBP_FN_HOST_REGISTER,
	UMBP_FN_HOST_UNREGISTER,
	UMBP_FN_MEMCPY,
	UMBP_FN_MEMCPY_ASYNC,
	UMBP_FN_STREAM_CREATE,
	UMBP_FN_STREAM_SYNCHRONIZE,
	UMBP_FN_STREAM_DESTROY,
	UMBP_FN_EVENT_CREATE,
	UMBP_FN_EVENT_RECORD,
	UMBP_FN_EVENT_SYNCHRONIZE,
	UMBP_FN_EVENT_QUERY,
	UMBP_FN_EVENT_DESTROY,
	UMBP_FN_POINTER_ATTRIBUTES,
	UMBP_FN_ADDRESS_RANGE,
	UMBP_FN_IPC_GET,
	UMBP_FN_IPC_OPEN,
	UMBP_FN_IPC_CLOSE,
	UMBP_FN_ERROR_STRING,
	UMBP_FN_DEVICE_SYNCHRONIZE,
	UMBP_FN_GET_LAST_ERROR,
	UMBP_FN_DRIVER_ERROR_STRING,
	UMBP_FN_MEMCPY_BATCH_ASYNC,
	UMBP_FN_COUNT
};

// hipIpcMemHandle_t and cudaIpcMemHandle_t: 64 bytes, passed by value.
typedef struct { char reserved[64]; } umbp_ipc_handle;

typedef struct {
	int vendor;
	void *fn[UMBP_FN_COUNT];
} umbp_table;

// A call's result: the code returned and the slot of the function that
// returned it.
typedef struct { int code; int fn; } umbp_rc;

static umbp_table *umbp_table_new(int vendor) {
	umbp_table *t = calloc(1, sizeof(umbp_table));
	if (t != NULL) t->vendor = vendor;
	return t;
}

static void umbp_copy_err(char *err, size_t n, const char *msg) {
	if (n == 0) return;
	if (msg == NULL) msg = "unknown dynamic loader error";
	strncpy(err, msg, n - 1);
	err[n - 1] = 0;
}

static void *umbp_dlopen(const char *path, char *err, size_t n) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) umbp_copy_err(err, n, dlerror());
	return h;
}

// Resolves name in h into slot idx (cleared first). Returns 0 on success.
static int umbp_bind(umbp_table *t, int idx, void *h, const char *name, char *err, size_t n) {
	t->fn[idx] = NULL;
	dlerror();
	void *p = dlsym(h, name);
	if (p == NULL) {
		const char *e = dlerror();
		umbp_copy_err(err, n, e != NULL ? e : "symbol resolves to NULL");
		return -1;
	}
	t->fn[idx] = p;
	return 0;
}

#define UMBP_FN(t, idx, type) ((type)(t)->fn[idx])

static umbp_rc umbp_rc_make(int code, int fn) {
	umbp_rc r;
	r.code = code;
	r.fn = fn;
	return r;
}

#define UMBP_SET_DEVICE(t, dev) do { \
	if ((dev) >= 0) { \
		int c_ = UMBP_FN(t, UMBP_FN_SET_DEVICE, int (*)(int))(dev); \
		if (c_ != 0) return umbp_rc_make(c_, UMBP_FN_SET_DEVICE); \
	} \
} while (0)

static umbp_rc umbp_init(const umbp_table *t) {
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_INIT, int (*)(unsigned int))(0), UMBP_FN_INIT);
}

static umbp_rc umbp_runtime_version(const umbp_table *t, int *v) {
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_RUNTIME_VERSION, int (*)(int *))(v), UMBP_FN_RUNTIME_VERSION);
}

static umbp_rc umbp_device_count(const umbp_table *t, int *n) {
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_DEVICE_COUNT, int (*)(int *))(n), UMBP_FN_DEVICE_COUNT);
}

static umbp_rc umbp_set_device(const umbp_table *t, int dev) {
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_SET_DEVICE, int (*)(int))(dev), UMBP_FN_SET_DEVICE);
}

static umbp_rc umbp_get_device(const umbp_table *t, int *dev) {
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_GET_DEVICE, int (*)(int *))(dev), UMBP_FN_GET_DEVICE);
}

static umbp_rc umbp_malloc(const umbp_table *t, int dev, size_t size, uintptr_t *out) {
	void *p = NULL;
	UMBP_SET_DEVICE(t, dev);
	int c = UMBP_FN(t, UMBP_FN_MALLOC, int (*)(void **, size_t))(&p, size);
	*out = (uintptr_t)p;
	return umbp_rc_make(c, UMBP_FN_MALLOC);
}

static umbp_rc umbp_free(const umbp_table *t, int dev, uintptr_t p) {
	UMBP_SET_DEVICE(t, dev);
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_FREE, int (*)(void *))((void *)p), UMBP_FN_FREE);
}

static umbp_rc umbp_host_register(const umbp_table *t, uintptr_t p, size_t n, unsigned int flags) {
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_HOST_REGISTER, int (*)(void *, size_t, unsigned int))((void *)p, n, flags),
		UMBP_FN_HOST_REGISTER);
}

static umbp_rc umbp_host_unregister(const umbp_table *t, uintptr_t p) {
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_HOST_UNREGISTER, int (*)(void *))((void *)p), UMBP_FN_HOST_UNREGISTER);
}

static umbp_rc umbp_memcpy_ptr(const umbp_table *t, int dev, void *dst, const void *src, size_t n, int kind) {
	UMBP_SET_DEVICE(t, dev);
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_MEMCPY, int (*)(void *, const void *, size_t, int))(dst, src, n, kind),
		UMBP_FN_MEMCPY);
}

static umbp_rc umbp_memcpy(const umbp_table *t, int dev, uintptr_t dst, uintptr_t src, size_t n, int kind) {
	return umbp_memcpy_ptr(t, dev, (void *)dst, (const void *)src, n, kind);
}

// Copies from Go memory (src) to dst.
static umbp_rc umbp_memcpy_to_device(const umbp_table *t, int dev, uintptr_t dst, const void *src, size_t n) {
	return umbp_memcpy_ptr(t, dev, (void *)dst, src, n, 1);
}

// Copies from src into Go memory (dst).
static umbp_rc umbp_memcpy_from_device(const umbp_table *t, int dev, void *dst, uintptr_t src, size_t n) {
	return umbp_memcpy_ptr(t, dev, dst, (const void *)src, n, 2);
}

static umbp_rc umbp_memcpy_async(const umbp_table *t, int dev, uintptr_t dst, uintptr_t src, size_t n, int kind,
		uintptr_t stream) {
	UMBP_SET_DEVICE(t, dev);
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_MEMCPY_ASYNC, int (*)(void *, const void *, size_t, int, void *))(
		(void *)dst, (const void *)src, n, kind, (void *)stream), UMBP_FN_MEMCPY_ASYNC);
}

static umbp_rc umbp_stream_create(const umbp_table *t, int dev, unsigned int flags, uintptr_t *out) {
	void *s = NULL;
	UMBP_SET_DEVICE(t, dev);
	int c = UMBP_FN(t, UMBP_FN_STREAM_CREATE, int (*)(void **, unsigned int))(&s, flags);
	*out = (uintptr_t)s;
	return umbp_rc_make(c, UMBP_FN_STREAM_CREATE);
}

// Calls slot idx, a function taking one handle, after selecting the device.
static umbp_rc umbp_handle_op(const umbp_table *t, int dev, int idx, uintptr_t h) {
	UMBP_SET_DEVICE(t, dev);
	return umbp_rc_make(UMBP_FN(t, idx, int (*)(void *))((void *)h), idx);
}

static umbp_rc umbp_event_create(const umbp_table *t, int dev, unsigned int flags, uintptr_t *out) {
	void *e = NULL;
	UMBP_SET_DEVICE(t, dev);
	int c = UMBP_FN(t, UMBP_FN_EVENT_CREATE, int (*)(void **, unsigned int))(&e, flags);
	*out = (uintptr_t)e;
	return umbp_rc_make(c, UMBP_FN_EVENT_CREATE);
}

static umbp_rc umbp_event_record(const umbp_table *t, int dev, uintptr_t ev, uintptr_t stream) {
	UMBP_SET_DEVICE(t, dev);
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_EVENT_RECORD, int (*)(void *, void *))((void *)ev, (void *)stream),
		UMBP_FN_EVENT_RECORD);
}

static umbp_rc umbp_device_synchronize(const umbp_table *t, int dev) {
	UMBP_SET_DEVICE(t, dev);
	return umbp_rc_make(UMBP_FN(t, UMBP_FN_DEVICE_SYNCHRONIZE, int (*)(void))(), UMBP_FN_DEVICE_SYNCHRONIZE);
}

// Fills buf (zeroed, 128 bytes) with the pointer's attributes. A failure is
// also cleared from the runtime's last-error state.
static umbp_rc umbp_pointer_attributes(const umbp_table *t, uintptr_t p, void *buf) {
	int c = UMBP_FN(t, UMBP_FN_POINTER_ATTRIBUTES, int (*)(void *, const void *))(buf, (const void *)p);
	if (c != 0 && t->fn[UMBP_FN_GET_LAST_ERROR] != NULL) UMBP_FN(t, UMBP_FN_GET_LAST_ERROR, int (*)(void))();
	return umbp_rc_make(c, UMBP_FN_POINTER_ATTRIBUTES);
}

// HIP: hipMemGetAddressRange. CUDA: cuMemGetAddressRange_v2 from the driver,
// which needs a current context: cudaSetDevice then cudaFree(NULL) make the
// device's primary context current on this thread first.
static umbp_rc umbp_address_range(const umbp_table *t, int dev, uintptr_t p, uintptr_t *base, size_t *size) {
	UMBP_SET_DEVICE(t, dev);
	if (t->vendor == UMBP_VENDOR_CUDA) {
		int c = UMBP_FN(t, UMBP_FN_FREE, int (*)(void *))(NULL);
		if (c != 0) return umbp_rc_make(c, UMBP_FN_FREE);
		unsigned long long b = 0;
		c = UMBP_FN(t, UMBP_FN_ADDRESS_RANGE, int (*)(unsigned long long *, size_t *, unsigned long long))(
			&b, size, (unsigned long long)p);
		*base = (uintptr_t)b;
		return umbp_rc_make(c, UMBP_FN_ADDRESS_RANGE);
	}
	void *b = NULL;
	int c = UMBP_FN(t, UMBP_FN_ADDRESS_RANGE, int (*)(void **, size_t *, void *))(&b, size, (void *)p);
	*base = (uintptr_t)b;
	return umbp_rc_make(c, UMBP_FN_ADDRESS_RANGE);
}

static umbp_rc umbp_ipc_get(const umbp_table *t, int dev, uintptr_t p, void *out) {
	umbp_ipc_handle h;
	memset(&h, 0, sizeof h);
	UMBP_SET_DEVICE(t, dev);
	int c = UMBP_FN(t, UMBP_FN_IPC_GET, int (*)(umbp_ipc_handle *, void *))(&h, (void *)p);
	memcpy(out, &h, sizeof h);
	return umbp_rc_make(c, UMBP_FN_IPC_GET);
}

static umbp_rc umbp_ipc_open(const umbp_table *t, int dev, const void *in, unsigned int flags, uintptr_t *out) {
	umbp_ipc_handle h;
	void *p = NULL;
	memcpy(&h, in, sizeof h);
	UMBP_SET_DEVICE(t, dev);
	int c = UMBP_FN(t, UMBP_FN_IPC_OPEN, int (*)(void **, umbp_ipc_handle, unsigned int))(&p, h, flags);
	*out = (uintptr_t)p;
	return umbp_rc_make(c, UMBP_FN_IPC_OPEN);
}

// cudaMemcpyAttributes (CUDA 12.8 and later): 24 bytes.
typedef struct {
	int src_access_order;         // cudaMemcpySrcAccessOrder
	int src_loc_type, src_loc_id; // cudaMemLocation srcLocHint
	int dst_loc_type, dst_loc_id; // cudaMemLocation dstLocHint
	unsigned int flags;
} umbp_memcpy_attrs;

enum { UMBP_ACCESS_ORDER_STREAM = 1, UMBP_LOC_DEVICE = 1, UMBP_LOC_HOST = 2 };

// cudaMemcpyBatchAsync with one attribute for every copy: stream order,
// the device and host named as the locations kind says. CUDA 13 dropped the
// failIdx parameter that 12.8 and 12.9 have: version selects the form.
static umbp_rc umbp_memcpy_batch_async(const umbp_table *t, int dev, int version, uintptr_t *dsts, uintptr_t *srcs,
		size_t *sizes, size_t count, int kind, unsigned int flags, uintptr_t stream) {
	UMBP_SET_DEVICE(t, dev);
	umbp_memcpy_attrs a;
	memset(&a, 0, sizeof a);
	a.src_access_order = UMBP_ACCESS_ORDER_STREAM;
	a.flags = flags;
	if (kind == 2) { // device to host
		a.src_loc_type = UMBP_LOC_DEVICE; a.src_loc_id = dev; a.dst_loc_type = UMBP_LOC_HOST;
	} else {
		a.src_loc_type = UMBP_LOC_HOST; a.dst_loc_type = UMBP_LOC_DEVICE; a.dst_loc_id = dev;
	}
	size_t idx = 0;
	void *fn = t->fn[UMBP_FN_MEMCPY_BATCH_ASYNC];
	int c;
	if (version >= 13000) {
		c = ((int (*)(void **, void **, size_t *, size_t, umbp_memcpy_attrs *, size_t *, size_t, void *))fn)(
			(void **)dsts, (void **)srcs, sizes, count, &a, &idx, 1, (void *)stream);
	} else {
		size_t fail = 0;
		c = ((int (*)(void **, void **, size_t *, size_t, umbp_memcpy_attrs *, size_t *, size_t, size_t *, void *))fn)(
			(void **)dsts, (void **)srcs, sizes, count, &a, &idx, 1, &fail, (void *)stream);
	}
	return umbp_rc_make(c, UMBP_FN_MEMCPY_BATCH_ASYNC);
}

// The text for code: from the driver's cuGetErrorString when driver is set,
// else from the runtime's error-string call. NULL when unavailable.
static const char *umbp_error_string(const umbp_table *t, int driver, int code) {
	if (driver) {
		const char *s = NULL;
		if (t->fn[UMBP_FN_DRIVER_ERROR_STRING] == NULL) return NULL;
		if (UMBP_FN(t, UMBP_FN_DRIVER_ERROR_STRING, int (*)(int, const char **))(code, &s) != 0) return NULL;
		return s;
	}
	if (t->fn[UMBP_FN_ERROR_STRING] == NULL) return NULL;
	return UMBP_FN(t, UMBP_FN_ERROR_STRING, const char *(*)(int))(code);
}

#endif // UMBP_TRAMPOLINES_H
