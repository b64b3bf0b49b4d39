/*
 * A fake GPU runtime for the package's tests: the HIP or CUDA entry points
 * the package binds, implemented over host memory, stricter than the real
 * runtimes where that catches binding mistakes:
 *
 *  - the current device is per thread; operations on an allocation, stream
 *    or event made on another device fail with "invalid device" (101), so a
 *    call that did not select its device in the same C call is caught;
 *  - memcpy kinds must agree with where the pointers live (21 otherwise);
 *  - the CUDA driver's address-range call needs a context made current on
 *    this thread by cudaFree(NULL) after cudaSetDevice (201 otherwise);
 *  - IPC handles carry a pattern in every byte, checked when opened, so a
 *    handle not passed whole by value is rejected (400); opening a handle made
 *    by this process fails with 201 unless its pid field was changed.
 *
 * Build with one of -DFAKE_HIP5, -DFAKE_HIP6, -DFAKE_CUDA; -DFAKE_DEVICES=n
 * (default 2); -DFAKE_OMIT_IPC_OPEN leaves out the IPC open symbol.
 *
 * -DFAKE_SHARED makes IPC work between processes, as on a real GPU: device
 * memory is a memfd mapped MAP_SHARED, its handle names the process and the
 * descriptor, and another process opens it by mapping /proc/PID/fd/FD (at an
 * address of its own). Without it, an opened handle maps to the same address
 * in the same process.
 */
#if defined(FAKE_SHARED)
#define _GNU_SOURCE /* memfd_create */
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(FAKE_SHARED)
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#endif

#ifndef FAKE_DEVICES
#define FAKE_DEVICES 2
#endif

#if defined(FAKE_CUDA)
#define API(x) cuda##x
#ifdef FAKE_CUDA_VERSION
#define FAKE_VERSION FAKE_CUDA_VERSION
#else
#define FAKE_VERSION 13000
#endif
#define T_UNREGISTERED 0
#define T_HOST 1
#define T_DEVICE 2
#define ATTR_SIZE 88
#elif defined(FAKE_HIP5)
#define API(x) hip##x
#define FAKE_VERSION 50731921
#define T_UNREGISTERED (-1) /* ROCm 5 rejects unregistered pointers */
#define T_HOST 0
#define T_DEVICE 1
#define ATTR_SIZE 32
#elif defined(FAKE_HIP6)
#define API(x) hip##x
#define FAKE_VERSION 60342131
#define T_UNREGISTERED 0
#define T_HOST 1
#define T_DEVICE 2
#define ATTR_SIZE 32
#else
#error "define FAKE_HIP5, FAKE_HIP6 or FAKE_CUDA"
#endif

#define E_INVALID_VALUE 1
#define E_NOT_READY 600
#define E_NO_DEVICE 100
#define E_INVALID_DEVICE 101
#define E_INVALID_CONTEXT 201
#define E_INVALID_HANDLE 400
#define E_MEMCPY_DIRECTION 21
#define E_ALREADY_REGISTERED 712
#define E_NOT_REGISTERED 713

#define EXPORT __attribute__((visibility("default")))

typedef struct { char reserved[64]; } ipc_handle;

/* K_HELD: device memory freed while an IPC mapping of it in this process
 * is still open; like a real driver, the fake keeps it until the last such
 * mapping is closed, so its addresses are not reused meanwhile. */
enum { K_FREE, K_DEVICE, K_HOST, K_IPC, K_HELD };

typedef struct {
	int kind;
	uintptr_t base;
	size_t size;
	int dev;
	void *mem; /* K_DEVICE: what to free */
	int fd;    /* FAKE_SHARED, K_DEVICE: the memfd */
} region;

#define MAX_REGIONS 256
static region regions[MAX_REGIONS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static __thread int cur_dev;
static __thread int ctx_dev = -1; /* CUDA: device whose context is current */

#define OBJ_MAGIC 0x51ea7e0bu
typedef struct {
	unsigned magic;
	int dev;
	unsigned flags;
} object;

static region *find(uintptr_t p, int kind) {
	for (int i = 0; i < MAX_REGIONS; i++) {
		region *r = &regions[i];
		if (r->kind == kind && p >= r->base && p < r->base + (r->size ? r->size : 1)) return r;
	}
	return NULL;
}

static region *add(int kind, uintptr_t base, size_t size, int dev, void *mem) {
	for (int i = 0; i < MAX_REGIONS; i++) {
		if (regions[i].kind == K_FREE) {
			region *r = &regions[i];
			r->kind = kind;
			r->base = base;
			r->size = size;
			r->dev = dev;
			r->mem = mem;
			r->fd = -1;
			return r;
		}
	}
	return NULL;
}

static int check_object(void *h, int want_dev) {
	object *o = h;
	if (o == NULL || o->magic != OBJ_MAGIC) return E_INVALID_HANDLE;
	if (o->dev != want_dev) return E_INVALID_DEVICE;
	return 0;
}

#if !defined(FAKE_CUDA)
EXPORT int hipInit(unsigned int flags) { return flags == 0 ? 0 : E_INVALID_VALUE; }
#endif

EXPORT int API(RuntimeGetVersion)(int *v) {
	*v = FAKE_VERSION;
	return 0;
}

EXPORT int API(GetDeviceCount)(int *n) {
	*n = FAKE_DEVICES;
#if defined(FAKE_CUDA)
	if (FAKE_DEVICES == 0) return E_NO_DEVICE;
#endif
	return 0;
}

EXPORT int API(SetDevice)(int d) {
	if (d < 0 || d >= FAKE_DEVICES) return E_INVALID_DEVICE;
	if (d != cur_dev) ctx_dev = -1;
	cur_dev = d;
	return 0;
}

EXPORT int API(GetDevice)(int *d) {
	*d = cur_dev;
	return 0;
}

#if defined(FAKE_SHARED)
static void *fake_alloc(size_t n, int *fd) {
	*fd = memfd_create("fakegpu", MFD_CLOEXEC);
	if (*fd < 0) return NULL;
	void *m = MAP_FAILED;
	if (ftruncate(*fd, (off_t)(n ? n : 1)) == 0)
		m = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (m == MAP_FAILED) {
		close(*fd);
		return NULL;
	}
	return m;
}

static void fake_release(region *r) {
	munmap(r->mem, r->size ? r->size : 1);
	close(r->fd);
}
#else
static void *fake_alloc(size_t n, int *fd) {
	*fd = -1;
	return calloc(1, n ? n : 1);
}

static void fake_release(region *r) { free(r->mem); }
#endif

EXPORT int API(Malloc)(void **p, size_t n) {
	int fd;
	void *m = fake_alloc(n, &fd);
	if (m == NULL) return 2;
	pthread_mutex_lock(&mu);
	region *r = add(K_DEVICE, (uintptr_t)m, n, cur_dev, m);
	if (r != NULL) r->fd = fd;
	pthread_mutex_unlock(&mu);
	if (r == NULL) {
		region tmp = {.mem = m, .size = n, .fd = fd};
		fake_release(&tmp);
		return 2;
	}
	*p = m;
	return 0;
}

/* ipc_alias reports whether an open IPC mapping lies in [base, base+size):
 * without FAKE_SHARED a foreign handle opens at the exporter's address. */
static int ipc_alias(uintptr_t base, size_t size) {
	for (int i = 0; i < MAX_REGIONS; i++) {
		region *r = &regions[i];
		if (r->kind == K_IPC && r->base >= base && r->base < base + (size ? size : 1)) return 1;
	}
	return 0;
}

EXPORT int API(Free)(void *p) {
	if (p == NULL) {
		ctx_dev = cur_dev; /* cudaFree(NULL) makes the primary context current */
		return 0;
	}
	int rc = E_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	region *r = find((uintptr_t)p, K_DEVICE);
	if (r != NULL && r->base == (uintptr_t)p) {
		if (r->dev != cur_dev) {
			rc = E_INVALID_DEVICE;
		} else {
			if (ipc_alias(r->base, r->size)) {
				r->kind = K_HELD;
			} else {
				fake_release(r);
				r->kind = K_FREE;
			}
			rc = 0;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

EXPORT int API(HostRegister)(void *p, size_t n, unsigned int flags) {
	if (p == NULL || n == 0 || flags > 0xf) return E_INVALID_VALUE;
	int rc = 0;
	pthread_mutex_lock(&mu);
	if (find((uintptr_t)p, K_HOST) != NULL || find((uintptr_t)p + n - 1, K_HOST) != NULL) {
		rc = E_ALREADY_REGISTERED;
	} else if (add(K_HOST, (uintptr_t)p, n, cur_dev, NULL) == NULL) {
		rc = 2;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

EXPORT int API(HostUnregister)(void *p) {
	int rc = E_NOT_REGISTERED;
	pthread_mutex_lock(&mu);
	region *r = find((uintptr_t)p, K_HOST);
	if (r != NULL && r->base == (uintptr_t)p) {
		r->kind = K_FREE;
		rc = 0;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

static int on_device(const void *p) {
	pthread_mutex_lock(&mu);
	int yes = find((uintptr_t)p, K_DEVICE) != NULL || find((uintptr_t)p, K_IPC) != NULL;
	pthread_mutex_unlock(&mu);
	return yes;
}

static int copy(void *dst, const void *src, size_t n, int kind) {
	int dd = on_device(dst), sd = on_device(src);
	switch (kind) {
	case 0: if (dd || sd) return E_MEMCPY_DIRECTION; break;
	case 1: if (!dd || sd) return E_MEMCPY_DIRECTION; break;
	case 2: if (dd || !sd) return E_MEMCPY_DIRECTION; break;
	case 3: if (!dd || !sd) return E_MEMCPY_DIRECTION; break;
	case 4: break;
	default: return E_MEMCPY_DIRECTION;
	}
	memmove(dst, src, n);
	return 0;
}

EXPORT int API(Memcpy)(void *dst, const void *src, size_t n, int kind) { return copy(dst, src, n, kind); }

EXPORT int API(MemcpyAsync)(void *dst, const void *src, size_t n, int kind, void *stream) {
	if (stream != NULL) {
		int rc = check_object(stream, cur_dev);
		if (rc != 0) return rc;
	}
	return copy(dst, src, n, kind);
}

static int create(void **out, unsigned int flags, unsigned int allowed) {
	if ((flags & ~allowed) != 0) return E_INVALID_VALUE;
	object *o = calloc(1, sizeof *o);
	o->magic = OBJ_MAGIC;
	o->dev = cur_dev;
	o->flags = flags;
	*out = o;
	return 0;
}

static int destroy(void *h) {
	int rc = check_object(h, cur_dev);
	if (rc != 0) return rc;
	((object *)h)->magic = 0;
	free(h);
	return 0;
}

EXPORT int API(StreamCreateWithFlags)(void **s, unsigned int flags) { return create(s, flags, 1); }
EXPORT int API(StreamSynchronize)(void *s) { return s == NULL ? 0 : check_object(s, cur_dev); }
EXPORT int API(StreamDestroy)(void *s) { return destroy(s); }
EXPORT int API(EventCreateWithFlags)(void **e, unsigned int flags) { return create(e, flags, 7); }

EXPORT int API(EventRecord)(void *e, void *s) {
	int rc = check_object(e, cur_dev);
	if (rc == 0 && s != NULL) rc = check_object(s, cur_dev);
	return rc;
}

EXPORT int API(EventSynchronize)(void *e) { return check_object(e, cur_dev); }

/* Events complete at once, unless UMBP_FAKE_EVENTS_PENDING is set in the
 * environment: then every query says not ready, as for a stream that never
 * gets there. */
EXPORT int API(EventQuery)(void *e) {
	int rc = check_object(e, cur_dev);
	if (rc != 0) return rc;
	const char *p = getenv("UMBP_FAKE_EVENTS_PENDING");
	return p != NULL && *p != 0 ? E_NOT_READY : 0;
}
EXPORT int API(EventDestroy)(void *e) { return destroy(e); }
EXPORT int API(DeviceSynchronize)(void) { return 0; }
EXPORT int API(GetLastError)(void) { return 0; }

EXPORT int API(PointerGetAttributes)(void *attrs, const void *p) {
	unsigned char a[ATTR_SIZE];
	int type = T_UNREGISTERED, dev = -2;
	void *dptr = NULL, *hptr = NULL;
	if (p == NULL) return E_INVALID_VALUE;
	memset(a, 0, sizeof a);
#if defined(FAKE_CUDA)
	memset(a + 24, 0xa5, sizeof a - 24); /* bytes this package must not read */
#endif
	pthread_mutex_lock(&mu);
	region *r = find((uintptr_t)p, K_DEVICE);
	if (r == NULL) r = find((uintptr_t)p, K_IPC);
	if (r != NULL) {
		type = T_DEVICE;
		dev = r->dev;
		dptr = (void *)p;
	} else if ((r = find((uintptr_t)p, K_HOST)) != NULL) {
		type = T_HOST;
		dev = r->dev;
		hptr = (void *)p;
	}
	pthread_mutex_unlock(&mu);
	if (type < 0) return E_INVALID_VALUE;
	memcpy(a + 0, &type, 4);
	memcpy(a + 4, &dev, 4);
	memcpy(a + 8, &dptr, 8);
	memcpy(a + 16, &hptr, 8);
	memcpy(attrs, a, sizeof a);
	return 0;
}

static int address_range(uintptr_t p, uintptr_t *base, size_t *size) {
	int rc = E_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	region *r = find(p, K_DEVICE);
	if (r != NULL) {
		if (r->dev != cur_dev) {
			rc = E_INVALID_DEVICE;
		} else {
			*base = r->base;
			*size = r->size;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

#if defined(FAKE_CUDA) && FAKE_VERSION >= 12080
/* cudaMemcpyBatchAsync: CUDA 13 dropped 12.8's failIdx. The fake checks the
 * attribute the way this package builds it (one, stream-ordered, locations
 * matching the direction of every copy) and then copies. */
typedef struct {
	int order, src_type, src_id, dst_type, dst_id;
	unsigned int flags;
} batch_attrs;

static int batch(void **dsts, void **srcs, size_t *sizes, size_t count, batch_attrs *attrs, size_t *idxs,
		size_t nattrs, void *stream) {
	const char *unsupported = getenv("UMBP_FAKE_BATCH_UNSUPPORTED");
	if (unsupported != NULL && *unsupported != 0) return 801; /* cudaErrorNotSupported */
	if (count == 0 || attrs == NULL || idxs == NULL || nattrs != 1 || idxs[0] != 0 || attrs->order != 1)
		return E_INVALID_VALUE;
	if (stream == NULL) return E_INVALID_VALUE; /* the legacy stream is refused */
	int rc = check_object(stream, cur_dev);
	if (rc != 0) return rc;
	int kind;
	if (attrs->src_type == 1 && attrs->dst_type == 2 && attrs->src_id == cur_dev) kind = 2;
	else if (attrs->src_type == 2 && attrs->dst_type == 1 && attrs->dst_id == cur_dev) kind = 1;
	else return E_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		if ((rc = copy(dsts[i], srcs[i], sizes[i], kind)) != 0) return rc;
	}
	return 0;
}

#if FAKE_VERSION >= 13000
EXPORT int cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count, batch_attrs *attrs,
		size_t *idxs, size_t nattrs, void *stream) {
	return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, stream);
}
#else
EXPORT int cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count, batch_attrs *attrs,
		size_t *idxs, size_t nattrs, size_t *fail, void *stream) {
	if (fail == NULL) return E_INVALID_VALUE;
	return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, stream);
}
#endif
#endif

#if defined(FAKE_CUDA)
/* The driver's entry points live in the same fake library. */
EXPORT int cuMemGetAddressRange_v2(unsigned long long *pbase, size_t *psize, unsigned long long dptr) {
	uintptr_t b = 0;
	if (ctx_dev != cur_dev) return E_INVALID_CONTEXT;
	int rc = address_range((uintptr_t)dptr, &b, psize);
	*pbase = b;
	return rc;
}

EXPORT int cuGetErrorString(int code, const char **s) {
	switch (code) {
	case E_INVALID_CONTEXT: *s = "driver: invalid device context"; return 0;
	case E_INVALID_VALUE: *s = "driver: invalid argument"; return 0;
	}
	*s = NULL;
	return E_INVALID_VALUE;
}
#else
EXPORT int hipMemGetAddressRange(void **pbase, size_t *psize, void *p) {
	uintptr_t b = 0;
	int rc = address_range((uintptr_t)p, &b, psize);
	*pbase = (void *)b;
	return rc;
}
#endif

#define HANDLE_MAGIC "FAKEIPC!"

static unsigned char pattern(int i) { return (unsigned char)(i * 7 + 3); }

EXPORT int API(IpcGetMemHandle)(ipc_handle *h, void *p) {
	int rc = E_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	region *r = find((uintptr_t)p, K_DEVICE);
	if (r != NULL) {
		if (r->dev != cur_dev) {
			rc = E_INVALID_DEVICE;
		} else {
			int pid = getpid();
			uint64_t base = r->base, size = r->size;
#if defined(FAKE_SHARED)
			base = (uint64_t)r->fd; /* what another process opens */
#endif
			memcpy(h->reserved, HANDLE_MAGIC, 8);
			memcpy(h->reserved + 8, &pid, 4);
			memcpy(h->reserved + 12, &r->dev, 4);
			memcpy(h->reserved + 16, &base, 8);
			memcpy(h->reserved + 24, &size, 8);
			for (int i = 32; i < 64; i++) h->reserved[i] = (char)pattern(i);
			rc = 0;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

#if !defined(FAKE_OMIT_IPC_OPEN)
EXPORT int API(IpcOpenMemHandle)(void **p, ipc_handle h, unsigned int flags) {
	int pid, dev;
	uint64_t base, size;
	if (flags != 1) return E_INVALID_VALUE;
	/* UMBP_FAKE_IPC_OPEN_FAILS set: every open fails, as where the runtime
	 * cannot reach the exporting process (another IPC namespace, say). */
	const char *fails = getenv("UMBP_FAKE_IPC_OPEN_FAILS");
	if (fails != NULL && fails[0] != '\0') return E_INVALID_CONTEXT;
	if (memcmp(h.reserved, HANDLE_MAGIC, 8) != 0) return E_INVALID_HANDLE;
	for (int i = 32; i < 64; i++)
		if ((unsigned char)h.reserved[i] != pattern(i)) return E_INVALID_HANDLE;
	memcpy(&pid, h.reserved + 8, 4);
	memcpy(&dev, h.reserved + 12, 4);
	memcpy(&base, h.reserved + 16, 8);
	memcpy(&size, h.reserved + 24, 8);
	if (pid == getpid()) return E_INVALID_CONTEXT;
	(void)dev;
#if defined(FAKE_SHARED)
	/* Map the exporting process's memfd, at an address of our own. */
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, (int)base);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) return E_INVALID_HANDLE;
	void *m = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) return E_INVALID_HANDLE;
	base = (uint64_t)(uintptr_t)m;
#endif
	/* A "foreign" handle: map the same memory again, as another process would. */
	pthread_mutex_lock(&mu);
	region *r = add(K_IPC, (uintptr_t)base, (size_t)size, cur_dev, (void *)(uintptr_t)base);
	pthread_mutex_unlock(&mu);
	if (r == NULL) return 2;
	*p = (void *)(uintptr_t)base;
	return 0;
}
#endif

EXPORT int API(IpcCloseMemHandle)(void *p) {
	int rc = E_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	region *r = find((uintptr_t)p, K_IPC);
	if (r != NULL && r->base == (uintptr_t)p) {
		if (r->dev != cur_dev) {
			rc = E_INVALID_DEVICE;
		} else {
#if defined(FAKE_SHARED)
			munmap(r->mem, r->size ? r->size : 1);
#endif
			r->kind = K_FREE;
			rc = 0;
			/* Device memory freed while this mapping was open goes now. */
			region *held = find((uintptr_t)p, K_HELD);
			if (held != NULL && !ipc_alias(held->base, held->size)) {
				fake_release(held);
				held->kind = K_FREE;
			}
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

EXPORT const char *API(GetErrorString)(int code) {
	switch (code) {
	case 0: return "no error";
	case E_INVALID_VALUE: return "invalid argument";
	case E_MEMCPY_DIRECTION: return "invalid copy direction for memcpy";
	case E_NO_DEVICE: return "no device";
	case E_INVALID_DEVICE: return "invalid device ordinal";
	case E_INVALID_CONTEXT: return "invalid device context";
	case E_INVALID_HANDLE: return "invalid resource handle";
	case E_ALREADY_REGISTERED: return "part or all of the requested memory range is already mapped";
	case E_NOT_REGISTERED: return "pointer does not correspond to a registered memory region";
	}
	return "unknown error";
}
