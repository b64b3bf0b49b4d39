#include "textflag.h"

// func ntCopy(dst, src *byte, n uintptr)
//
// Copies n bytes, a non-zero multiple of 128, from src to dst, which is
// 32-byte aligned, with non-temporal stores; the regions do not overlap.
TEXT ·ntCopy(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
loop:
	VMOVDQU	(SI), Y0
	VMOVDQU	32(SI), Y1
	VMOVDQU	64(SI), Y2
	VMOVDQU	96(SI), Y3
	VMOVNTDQ	Y0, (DI)
	VMOVNTDQ	Y1, 32(DI)
	VMOVNTDQ	Y2, 64(DI)
	VMOVNTDQ	Y3, 96(DI)
	ADDQ	$128, SI
	ADDQ	$128, DI
	SUBQ	$128, CX
	JNZ	loop
	// The stores are weakly ordered: make them visible before the copy is
	// reported done.
	SFENCE
	VZEROUPPER
	RET
