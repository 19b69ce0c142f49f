/* startup.c: reset and exception handling for the Cortex-M boards (M4 and M7, ARMv7E-M; M55, Armv8.1-M).
 *
 * Reset_Handler: FPU on, stack painted, .data copied from flash, .bss zeroed, SysTick started
 * as the instruction counter, then tt_exit(tt_main()). Every fault and every unexpected
 * interrupt prints the fault registers and exits through semihosting with 100 + the exception
 * number, so a crash ends the emulator with a clear code instead of hanging it.
 */
#include <stdint.h>

#include "semihost.h"
#include "tt_platform.h"

/* From the linker script (cortexm_sections.ld). */
extern uint32_t __stack_bottom[], __stack_top[];
extern uint32_t __data_load[], __data_start[], __data_end[];
extern uint32_t __bss_start[], __bss_end[];
extern uint32_t __vectors_start[], __vectors_end[], __flash_start[], __flash_end[], __ram_start[], __ram_end[];

#define REG32(addr) (*(volatile uint32_t *)(uintptr_t)(addr))
#define SCB_ICSR 0xE000ED04u
#define SCB_CPACR 0xE000ED88u
#define SCB_CFSR 0xE000ED28u
#define SCB_HFSR 0xE000ED2Cu
#define SCB_MMFAR 0xE000ED34u
#define SCB_BFAR 0xE000ED38u
#define SYST_CSR 0xE000E010u
#define SYST_RVR 0xE000E014u
#define SYST_CVR 0xE000E018u
#define ICSR_PENDSTSET (1u << 26)
#define MPU_CTRL 0xE000ED94u
#define MPU_RNR 0xE000ED98u
#define MPU_RBAR 0xE000ED9Cu
#define MPU_RASR 0xE000EDA0u /* PMSAv7 (ARMv7-M) */
#define MPU_RLAR 0xE000EDA0u /* PMSAv8 (Armv8-M): the same address, a limit instead of a size */
#define MPU_MAIR0 0xE000EDC0u
#define FPU_FPDSCR 0xE000EF3Cu   /* the FPSCR defaults of a new floating-point context */
/* FPSCR's mode bits: AHP (26), DN (25), FZ (24), RMode (23:22), FZ16 (19: Armv8.1-M with half precision) */
#define FPSCR_MODE_BITS ((7u << 24) | (3u << 22) | (1u << 19))

#if defined(__ARM_ARCH_8M_MAIN__) || defined(__ARM_ARCH_8M_BASE__)
#define TT_PMSAV8 1 /* Armv8-M (and 8.1-M, for which gcc 12 defines __ARM_ARCH_8M_MAIN__ too) */
#else
#define TT_PMSAV8 0
#endif

/* MPU guard below RAM: QEMU's mps2 reads unmapped memory under 0x20000000 as zeros without a
 * fault, so a stack that grows past ORIGIN(RAM) must be stopped by the MPU. 256 MB, no access. */
#define TT_GUARD_BASE 0x10000000u
#define TT_GUARD_SIZE_LOG2 28u

/* A word no program writes by chance; the deepest word that still holds it marks the
 * stack's high-water mark. */
#define TT_STACK_PAINT 0xC0DEF00Du

/* -icount shift=0: 1 ns per instruction, so instructions per SysTick tick = 1 GHz / the system clock,
 * as the fraction NUM / DEN (cross-compile passes the board's: 40/1 at 25 MHz, 125/4 at 32 MHz). */
#ifndef TT_INSNS_PER_TICK
#define TT_INSNS_PER_TICK 40
#endif
#ifndef TT_INSNS_PER_TICK_DEN
#define TT_INSNS_PER_TICK_DEN 1
#endif

void Reset_Handler(void) __attribute__((noreturn));
void Fault_Handler(void) __attribute__((naked));
void SysTick_Handler(void);
void tt_fault_report(const uint32_t *frame, uint32_t ipsr, uint32_t exc_return, uint32_t sp) __attribute__((noreturn, used));

static volatile uint32_t systick_wraps;

/* ---- reset ------------------------------------------------------------------------------------ */

/* Plain word loops, kept out of memcpy/memset: at this point .data/.bss are not set up yet and
 * nothing here may depend on them. */
__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void init_memory(void) {
    uint32_t *sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    /* Paint the stack below what this function already uses (64 bytes of margin). */
    for (uint32_t *p = __stack_bottom; p < sp - 16; p++) *p = TT_STACK_PAINT;
    for (uint32_t *s = __data_load, *d = __data_start; d < __data_end;) *d++ = *s++;
    for (uint32_t *d = __bss_start; d < __bss_end;) *d++ = 0;
}

#if TT_PMSAV8
/* PMSAv8 regions are [base, limit] in 32-byte units and have no "no access" permission, so the
 * guard is the absence of a region: the background map is off (no PRIVDEFENA) and only the board's
 * memories are mapped: the code memories read-only (QEMU backs them with RAM; a real part's flash
 * refuses plain stores too), RAM read-write and never executed. Any other address - below RAM,
 * where a stack overflow goes, or a stray pointer - is a MemManage fault. The System Control Space
 * (SysTick, SCB, MPU) is not subject to the MPU. */
static void mpu_region(uint32_t n, uintptr_t start, uintptr_t end, uint32_t rbar_flags) {
    REG32(MPU_RNR) = n;
    REG32(MPU_RBAR) = ((uint32_t)start & ~31u) | rbar_flags;
    REG32(MPU_RLAR) = (((uint32_t)end - 1u) & ~31u) | (0u << 1) /* AttrIndx 0 */ | 1u /* EN */;
}

static void mpu_init(void) {
    REG32(MPU_MAIR0) = 0xFFu; /* attribute 0: normal memory, write-back, read/write-allocate */
    uint32_t n = 0;
    mpu_region(n++, (uintptr_t)__flash_start, (uintptr_t)__flash_end, 0x3u << 1 /* AP: read-only */);
    if ((uintptr_t)__vectors_start != (uintptr_t)__flash_start) /* regions may not overlap: an address in two of them faults */
        mpu_region(n++, (uintptr_t)__vectors_start, (uintptr_t)__vectors_end, 0x3u << 1);
    mpu_region(n++, (uintptr_t)__ram_start, (uintptr_t)__ram_end, (0x1u << 1) /* AP: read-write */ | 1u /* XN */);
    REG32(MPU_CTRL) = 1u; /* ENABLE, no PRIVDEFENA */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
}
#else
/* Region 0: the flash image (QEMU backs it with RAM) read-only, as a real part's flash is to
 * plain stores, so a write through a pointer to `const` faults here too. Region 1: the guard
 * below RAM. Everything else keeps the default map (PRIVDEFENA). */
static void mpu_init(void) {
    REG32(MPU_RNR) = 0;
    REG32(MPU_RBAR) = 0x00000000u;
    REG32(MPU_RASR) = (0x6u << 24) /* AP: read-only */ | ((22u - 1u) << 1) /* 4 MB */ | 1u;
    REG32(MPU_RNR) = 1;
    REG32(MPU_RBAR) = TT_GUARD_BASE;
    REG32(MPU_RASR) = (1u << 28) /* XN */ | (0x0u << 24) /* no access */ | ((TT_GUARD_SIZE_LOG2 - 1u) << 1) | 1u;
    REG32(MPU_CTRL) = (1u << 2) /* PRIVDEFENA */ | 1u /* ENABLE */;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
}
#endif

void Reset_Handler(void) {
    /* FPU first: with -mfloat-abi=hard the compiler may use VFP registers anywhere, and an FP
     * instruction with CP10/CP11 disabled is a UsageFault (NOCP). On Armv8.1-M the same two
     * coprocessor fields enable MVE (Helium). */
    REG32(SCB_CPACR) |= (0xFu << 20);
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#if defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC)
    /* The Cortex-M55: IEEE mode stated, not left to the reset values. Round to nearest even, NaN payloads kept
     * (DN = 0), subnormals kept (FZ = 0, and FZ16 = 0: Helium's fp16 arithmetic takes FZ16 from FPSCR, while its
     * fp32 arithmetic always flushes: kernels_c/tt_f16_mve.h), IEEE half precision (AHP = 0): the host's bits. Both
     * the live FPSCR and FPDSCR, which the core copies into FPSCR for each new floating-point context (an exception
     * handler's). tests/test_m55_f16_ops.py reads FPSCR in tt_main. */
    REG32(FPU_FPDSCR) &= ~FPSCR_MODE_BITS;
    {
        uint32_t fpscr;
        __asm__ volatile("vmrs %0, fpscr" : "=r"(fpscr));
        __asm__ volatile("vmsr fpscr, %0" : : "r"(fpscr & ~FPSCR_MODE_BITS) : "memory");
    }
#endif
    init_memory();
    mpu_init();
    /* SysTick on the processor clock, interrupting on each 24-bit wrap so the count extends to
     * 64 bits (see tt_instructions). */
    REG32(SYST_RVR) = 0x00FFFFFFu;
    REG32(SYST_CVR) = 0;
    REG32(SYST_CSR) = 7u; /* ENABLE | TICKINT | CLKSOURCE=processor */
    /* The counter reads 0 until its first reload; reading it then would look like a full
     * 2^24-tick period had passed. */
    while (REG32(SYST_CVR) == 0) {
    }
    tt_exit(tt_main());
}

void SysTick_Handler(void) {
    systick_wraps++;
}

/* ---- measurement ------------------------------------------------------------------------------ */

int tt_have_instructions(void) {
    return 1;
}

uint64_t tt_instructions(void) {
    uint32_t primask;
    __asm__ volatile("mrs %0, primask\n\tcpsid i" : "=r"(primask)::"memory");
    uint32_t wraps = systick_wraps;
    uint32_t val = REG32(SYST_CVR);
    if (REG32(SCB_ICSR) & ICSR_PENDSTSET) {
        /* Wrapped, but the interrupt has not run yet: count that wrap here, and re-read the
         * counter, which we may have read just before it reloaded. */
        wraps++;
        val = REG32(SYST_CVR);
    }
    __asm__ volatile("msr primask, %0" ::"r"(primask) : "memory");
    uint64_t ticks = (uint64_t)wraps * 0x1000000u + (0x00FFFFFFu - val);
    return ticks * TT_INSNS_PER_TICK / TT_INSNS_PER_TICK_DEN;
}

uint32_t tt_stack_high_water(void) {
    const uint32_t *p = __stack_bottom;
    while (p < __stack_top && *p == TT_STACK_PAINT) p++;
    return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)p);
}

uint32_t tt_stack_size(void) {
    return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)__stack_bottom);
}

/* ---- faults ----------------------------------------------------------------------------------- */

/* The 8 words the CPU stacked on exception entry (R0-R3, R12, LR, PC, xPSR), copied out so that
 * the report can use the stack freely. */
uint32_t tt_fault_frame[8];

/* Finds the stacked frame (MSP or PSP, per EXC_RETURN bit 2), copies it if it lies inside the
 * stack, and moves SP back to the top of the stack before any push: after a stack overflow SP
 * points into the guard below RAM, and a push there would fault again and lock the core up.
 * Calls tt_fault_report(frame copy or NULL, IPSR, EXC_RETURN, SP at the fault). */
void Fault_Handler(void) {
    __asm__ volatile(
        "tst lr, #4\n\t"
        "ite eq\n\t"
        "mrseq r12, msp\n\t"
        "mrsne r12, psp\n\t"
        "ldr r3, =__stack_top\n\t"
        "mov sp, r3\n\t"
        "movs r0, #0\n\t"
        "ldr r3, =__stack_bottom\n\t"
        "cmp r12, r3\n\t"
        "blo 1f\n\t"
        "ldr r3, =__stack_top - 32\n\t"
        "cmp r12, r3\n\t"
        "bhi 1f\n\t"
        "ldmia r12, {r4-r11}\n\t"
        "ldr r0, =tt_fault_frame\n\t"
        "stmia r0, {r4-r11}\n\t"
        "1:\n\t"
        "mrs r1, ipsr\n\t"
        "mov r2, lr\n\t"
        "mov r3, r12\n\t"
        "b tt_fault_report\n\t"
        ".ltorg\n\t");
}

static const char *exception_name(uint32_t n) {
    switch (n) {
    case 2: return "NMI";
    case 3: return "HardFault";
    case 4: return "MemManage";
    case 5: return "BusFault";
    case 6: return "UsageFault";
    case 7: return "SecureFault";
    case 11: return "SVCall";
    case 12: return "DebugMonitor";
    case 14: return "PendSV";
    default: return n >= 16 ? "IRQ" : "reserved exception";
    }
}

void tt_fault_report(const uint32_t *frame, uint32_t ipsr, uint32_t exc_return, uint32_t sp) {
    uint32_t n = ipsr & 0x1FFu;
    uint32_t cfsr = REG32(SCB_CFSR), hfsr = REG32(SCB_HFSR);
    tt_log("@tt fault %s (exception %lu) on %s\n", exception_name(n), (unsigned long)n, tt_board());
    tt_log("  CFSR=0x%08lx HFSR=0x%08lx MMFAR=0x%08lx BFAR=0x%08lx EXC_RETURN=0x%08lx\n", (unsigned long)cfsr,
           (unsigned long)hfsr, (unsigned long)REG32(SCB_MMFAR), (unsigned long)REG32(SCB_BFAR),
           (unsigned long)exc_return);
    if (frame) {
        tt_log("  PC=0x%08lx LR=0x%08lx xPSR=0x%08lx R0=0x%08lx R1=0x%08lx R2=0x%08lx R3=0x%08lx R12=0x%08lx\n",
               (unsigned long)frame[6], (unsigned long)frame[5], (unsigned long)frame[7], (unsigned long)frame[0],
               (unsigned long)frame[1], (unsigned long)frame[2], (unsigned long)frame[3], (unsigned long)frame[4]);
    } else {
        tt_log("  no exception frame: SP=0x%08lx is outside the stack [0x%08lx, 0x%08lx) - stack overflow?\n",
               (unsigned long)sp, (unsigned long)(uintptr_t)__stack_bottom, (unsigned long)(uintptr_t)__stack_top);
    }
    if (cfsr & (1u << 25)) tt_log("  UsageFault: divide by zero\n");
    if (cfsr & (1u << 24)) tt_log("  UsageFault: unaligned access\n");
    if (cfsr & (1u << 20)) tt_log("  UsageFault: stack limit reached (stack overflow)\n");
    if (cfsr & (1u << 19)) tt_log("  UsageFault: FPU disabled (NOCP)\n");
    if (cfsr & (1u << 16)) tt_log("  UsageFault: undefined instruction\n");
    if (cfsr & (1u << 15)) tt_log("  BusFault: bad data address 0x%08lx\n", (unsigned long)REG32(SCB_BFAR));
    if (cfsr & (1u << 12)) tt_log("  BusFault: stacking failed (stack overflow)\n");
    if (cfsr & (1u << 7)) {
        uint32_t a = REG32(SCB_MMFAR);
        tt_log("  MemManage: bad data address 0x%08lx\n", (unsigned long)a);
        if (a >= TT_GUARD_BASE && a < (uintptr_t)__stack_bottom)
            tt_log("  stack overflow: the stack (%lu bytes) ran below RAM\n", (unsigned long)tt_stack_size());
        else if ((a >= (uintptr_t)__flash_start && a < (uintptr_t)__flash_end) ||
                 (a >= (uintptr_t)__vectors_start && a < (uintptr_t)__vectors_end))
            tt_log("  write to flash (a pointer to const data?)\n");
    }
    if (cfsr & (1u << 4)) tt_log("  MemManage: stacking failed (stack overflow)\n");
    tt_exit(n >= 16 ? TT_EXIT_UNEXPECTED_IRQ : TT_EXIT_FAULT_BASE + (int)n);
}

/* ---- vector table ----------------------------------------------------------------------------- */

#if TT_PMSAV8
#define TT_NUM_IRQS 96 /* mps3-an547 wires 96 (QEMU) */
#else
#define TT_NUM_IRQS 48 /* mps2-an386/an500 wire 32 (QEMU); a few spare catch stray numbers */
#endif

typedef void (*tt_vector)(void);

/* At the boot address (ORIGIN(FLASH) = 0): initial SP, reset, the 14 system exceptions, IRQs. */
__attribute__((section(".isr_vector"), used)) const tt_vector tt_vectors[16 + TT_NUM_IRQS] = {
    (tt_vector)(uintptr_t)__stack_top,
    Reset_Handler,
    Fault_Handler, /* NMI */
    Fault_Handler, /* HardFault */
    Fault_Handler, /* MemManage */
    Fault_Handler, /* BusFault */
    Fault_Handler, /* UsageFault */
    Fault_Handler, /* SecureFault (Armv8-M), reserved before */
    0, 0, 0,
    Fault_Handler, /* SVCall */
    Fault_Handler, /* DebugMonitor */
    0,
    Fault_Handler, /* PendSV */
    SysTick_Handler,
    [16 ... 16 + TT_NUM_IRQS - 1] = Fault_Handler,
};
