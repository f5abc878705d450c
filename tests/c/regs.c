/*
 * Register victim: loads known patterns into callee-saved GPRs (rbx,
 * r12-r15), all 16 vector registers (ymm with AVX, else xmm) and the x87
 * stack top, then waits for WORKDIR/go entirely inside one asm block using
 * raw syscalls, which clobber only rax, rcx and r11.  A dump can therefore hit
 * at any instruction of the loop and the registers must still hold the
 * patterns when the loop ends.  The x87 control word and MXCSR are set to
 * non-default values beforehand and checked afterwards.
 *
 * Usage: regs WORKDIR [sse]   ("sse" forces the xmm-only variant)
 */
#include "victim.h"

#include <fenv.h>
#include <stddef.h>

struct state {
	uint64_t gpr[5]; /* rbx, r12, r13, r14, r15 */
	uint64_t pad[3];
	unsigned char vec[16][32];
	long double x87;
} __attribute__((aligned(32)));

/* The asm below hardcodes these offsets. */
_Static_assert(offsetof(struct state, vec) == 64, "vec offset");
_Static_assert(offsetof(struct state, x87) == 576, "x87 offset");

static struct state in, out;
static char go_path[PATH_MAX];
static const struct timespec tick = { 0, 10 * 1000 * 1000 };
static const char *gpr_names[5] = { "rbx", "r12", "r13", "r14", "r15" };

/* Non-default FP control state: round up, 53-bit x87 precision, FTZ+DAZ. */
#define X87_CW 0x0A7F
#define MXCSR_VAL 0xDFC0
#define MXCSR_FLAGS 0x3F /* sticky exception flags: not compared */

#define LOAD_GPRS                                                              \
	"mov 0(%[in]), %%rbx\n\t"                                              \
	"mov 8(%[in]), %%r12\n\t"                                              \
	"mov 16(%[in]), %%r13\n\t"                                             \
	"mov 24(%[in]), %%r14\n\t"                                             \
	"mov 32(%[in]), %%r15\n\t"                                             \
	"fldt 576(%[in])\n\t"

/* nanosleep(&tick, NULL); rax = access(go_path, F_OK); until rax == 0. */
#define WAIT_LOOP                                                              \
	"1:\n\t"                                                               \
	"mov $35, %%eax\n\t"                                                   \
	"mov %[ts], %%rdi\n\t"                                                 \
	"xor %%esi, %%esi\n\t"                                                 \
	"syscall\n\t"                                                          \
	"mov $21, %%eax\n\t"                                                   \
	"mov %[path], %%rdi\n\t"                                               \
	"xor %%esi, %%esi\n\t"                                                 \
	"syscall\n\t"                                                          \
	"test %%rax, %%rax\n\t"                                                \
	"jnz 1b\n\t"

#define STORE_GPRS                                                             \
	"mov %%rbx, 0(%[out])\n\t"                                             \
	"mov %%r12, 8(%[out])\n\t"                                             \
	"mov %%r13, 16(%[out])\n\t"                                            \
	"mov %%r14, 24(%[out])\n\t"                                            \
	"mov %%r15, 32(%[out])\n\t"                                            \
	"fstpt 576(%[out])\n\t"

#define CLOBBERS                                                               \
	"rax", "rcx", "r11", "rdi", "rsi", "rbx", "r12", "r13", "r14", "r15",  \
		"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",        \
		"xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",    \
		"xmm14", "xmm15", "st", "memory", "cc"

#define V(op, n, off) op " " off "(%[in]), %%" n "\n\t"
#define S(op, n, off) op " %%" n ", " off "(%[out])\n\t"

static void wait_avx(void)
{
	__asm__ volatile(LOAD_GPRS
		V("vmovdqa", "ymm0", "64") V("vmovdqa", "ymm1", "96")
		V("vmovdqa", "ymm2", "128") V("vmovdqa", "ymm3", "160")
		V("vmovdqa", "ymm4", "192") V("vmovdqa", "ymm5", "224")
		V("vmovdqa", "ymm6", "256") V("vmovdqa", "ymm7", "288")
		V("vmovdqa", "ymm8", "320") V("vmovdqa", "ymm9", "352")
		V("vmovdqa", "ymm10", "384") V("vmovdqa", "ymm11", "416")
		V("vmovdqa", "ymm12", "448") V("vmovdqa", "ymm13", "480")
		V("vmovdqa", "ymm14", "512") V("vmovdqa", "ymm15", "544")
		WAIT_LOOP
		STORE_GPRS
		S("vmovdqa", "ymm0", "64") S("vmovdqa", "ymm1", "96")
		S("vmovdqa", "ymm2", "128") S("vmovdqa", "ymm3", "160")
		S("vmovdqa", "ymm4", "192") S("vmovdqa", "ymm5", "224")
		S("vmovdqa", "ymm6", "256") S("vmovdqa", "ymm7", "288")
		S("vmovdqa", "ymm8", "320") S("vmovdqa", "ymm9", "352")
		S("vmovdqa", "ymm10", "384") S("vmovdqa", "ymm11", "416")
		S("vmovdqa", "ymm12", "448") S("vmovdqa", "ymm13", "480")
		S("vmovdqa", "ymm14", "512") S("vmovdqa", "ymm15", "544")
		"vzeroupper\n\t"
		:
		: [in] "r"(&in), [out] "r"(&out), [ts] "r"(&tick), [path] "r"(go_path)
		: CLOBBERS);
}

static void wait_sse(void)
{
	__asm__ volatile(LOAD_GPRS
		V("movdqa", "xmm0", "64") V("movdqa", "xmm1", "96")
		V("movdqa", "xmm2", "128") V("movdqa", "xmm3", "160")
		V("movdqa", "xmm4", "192") V("movdqa", "xmm5", "224")
		V("movdqa", "xmm6", "256") V("movdqa", "xmm7", "288")
		V("movdqa", "xmm8", "320") V("movdqa", "xmm9", "352")
		V("movdqa", "xmm10", "384") V("movdqa", "xmm11", "416")
		V("movdqa", "xmm12", "448") V("movdqa", "xmm13", "480")
		V("movdqa", "xmm14", "512") V("movdqa", "xmm15", "544")
		WAIT_LOOP
		STORE_GPRS
		S("movdqa", "xmm0", "64") S("movdqa", "xmm1", "96")
		S("movdqa", "xmm2", "128") S("movdqa", "xmm3", "160")
		S("movdqa", "xmm4", "192") S("movdqa", "xmm5", "224")
		S("movdqa", "xmm6", "256") S("movdqa", "xmm7", "288")
		S("movdqa", "xmm8", "320") S("movdqa", "xmm9", "352")
		S("movdqa", "xmm10", "384") S("movdqa", "xmm11", "416")
		S("movdqa", "xmm12", "448") S("movdqa", "xmm13", "480")
		S("movdqa", "xmm14", "512") S("movdqa", "xmm15", "544")
		:
		: [in] "r"(&in), [out] "r"(&out), [ts] "r"(&tick), [path] "r"(go_path)
		: CLOBBERS);
}

static uint16_t get_x87_cw(void)
{
	uint16_t cw;

	__asm__ volatile("fnstcw %0" : "=m"(cw));
	return cw;
}

static uint32_t get_mxcsr(void)
{
	uint32_t v;

	__asm__ volatile("stmxcsr %0" : "=m"(v));
	return v;
}

/* Division result that depends on the rounding mode in effect. */
static double third(void)
{
	volatile double a = 1.0, b = 3.0;

	return a / b;
}

int main(int argc, char **argv)
{
	int avx;
	double third_before;
	uint16_t cw = X87_CW;
	uint32_t mxcsr = MXCSR_VAL;

	victim_init(argc, argv);
	avx = __builtin_cpu_supports("avx") && !(argc > 2 && strcmp(argv[2], "sse") == 0);
	victim_path(go_path, sizeof(go_path), "go");

	for (int i = 0; i < 5; i++)
		in.gpr[i] = 0x0123456789abcdefULL ^ (0x1111111111111111ULL * (uint64_t)(i + 1)) ^
			    ((uint64_t)i << 61);
	fill_pattern(in.vec, sizeof(in.vec), 42);
	in.x87 = 1.0L / 7.0L;
	memset(&out, 0, sizeof(out));

	if (fesetround(FE_UPWARD) != 0)
		die("fesetround");
	__asm__ volatile("fldcw %0" : : "m"(cw));
	__asm__ volatile("ldmxcsr %0" : : "m"(mxcsr));
	third_before = third();

	/* Ready just before the loop: the loop tolerates being dumped anywhere. */
	victim_signal_ready(avx ? "avx" : "sse");
	if (avx)
		wait_avx();
	else
		wait_sse();

	for (int i = 0; i < 5; i++)
		CHECK(out.gpr[i] == in.gpr[i], "%s = %#llx, want %#llx", gpr_names[i],
		      (unsigned long long)out.gpr[i], (unsigned long long)in.gpr[i]);
	for (int i = 0; i < 16; i++) {
		size_t width = avx ? 32 : 16;

		for (size_t b = 0; b < width; b++) {
			if (out.vec[i][b] != in.vec[i][b]) {
				fail("%s%d byte %zu = %#x, want %#x", avx ? "ymm" : "xmm", i, b,
				     out.vec[i][b], in.vec[i][b]);
				break;
			}
		}
	}
	CHECK(memcmp(&out.x87, &in.x87, 10) == 0, "x87 st(0) changed");
	CHECK(get_x87_cw() == X87_CW, "x87 control word %#x, want %#x", get_x87_cw(), X87_CW);
	CHECK((get_mxcsr() & ~MXCSR_FLAGS) == (MXCSR_VAL & ~MXCSR_FLAGS), "MXCSR %#x, want %#x",
	      get_mxcsr(), MXCSR_VAL);
	CHECK(fegetround() == FE_UPWARD, "rounding mode %#x, want FE_UPWARD", fegetround());
	CHECK(third() == third_before, "1/3 rounds differently after restore");
	victim_finish();
}
