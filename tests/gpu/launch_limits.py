#!/usr/bin/env python3
"""launch_limits.py PTXAS_LOG... -- TRACE...: do lutra's kernel launches fit
what a Hopper GPU (sm_90) gives one block? The CUDA emulator runs any launch
the CUDA API allows, but a GPU also refuses a block whose threads need more
registers than a multiprocessor has for one block (cudaErrorLaunchOutOfResources)
or more than 48 KiB of static plus dynamic shared memory without an opt-in.
The registers and static shared memory are ptxas's own figures (`nvcc -Xptxas
-v`, which the Makefile keeps next to each object as NAME.o.ptxas); the block
sizes are those the GPU checks launched on the emulator (LUTRA_EMU_TRACE's
`kernel NAME GRID BLOCK SMEM` lines, tests/emu/README.md).

A kernel's instantiations share one name in the trace (`unary_kernel<S>`),
so each name is held to its largest figures over them. Limits (CUDA C++
Programming Guide, compute capability 9.0): 65536 registers per block,
allocated per warp in units of 256; 48 KiB of shared memory per block
without cudaFuncAttributeMaxDynamicSharedMemorySize (lutra sets none).

Prints one line per kernel name launched (threads, registers, shared
memory, the block's register use) and `launch limits: N kernels fit, M do
not`; exits 1 when one does not fit or no launch was traced."""
import re
import subprocess
import sys

REGS_PER_BLOCK = 65536
REG_UNIT = 256          # registers are given to a warp in these units
SMEM_PER_BLOCK = 48 * 1024


def base_name(name):
    """`void (anonymous namespace)::foo_kernel<float, 64>(int)` or `foo_kernel<S, A>` -> foo_kernel"""
    head = name.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0].strip()
    return head.split()[-1].split("::")[-1] if head else name


def ptxas_figures(paths):
    """base kernel name -> (registers, static shared bytes), the largest over
    the name's instantiations"""
    entries, current = {}, None
    for path in paths:
        with open(path) as f:
            for line in f:
                m = re.search(r"Compiling entry function '([^']+)'", line)
                if m:
                    current = m.group(1)
                    continue
                m = re.search(r"Used (\d+) registers", line)
                if m and current:
                    smem = re.search(r"(\d+) bytes smem", line)
                    entries[current] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
                    current = None
    mangled = list(entries)
    names = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    figures = {}
    for m, n in zip(mangled, names):
        b = base_name(n)
        r, s = figures.get(b, (0, 0))
        figures[b] = (max(r, entries[m][0]), max(s, entries[m][1]))
    return figures


def traced_launches(paths):
    """base kernel name -> (largest block in threads, largest dynamic shared bytes)"""
    launches = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) < 2 or p[1] != "kernel":
                    continue
                if len(p) < 6 or not p[-1].isdigit():
                    raise SystemExit("launch_limits.py: %s: a kernel line without GRID BLOCK SMEM: %s"
                                     % (path, line.strip()))
                threads = 1
                for x in p[-2].split(","):
                    threads *= int(x)
                b = base_name(" ".join(p[2:-3]))
                t, s = launches.get(b, (0, 0))
                launches[b] = (max(t, threads), max(s, int(p[-1])))
    return launches


def block_registers(regs, threads):
    warps = (threads + 31) // 32
    per_warp = -(-regs * 32 // REG_UNIT) * REG_UNIT
    return warps * per_warp


def main(argv):
    if "--" not in argv or argv.index("--") == 0 or len(argv) < argv.index("--") + 2:
        raise SystemExit("usage: launch_limits.py PTXAS_LOG... -- TRACE...")
    try:
        figures = ptxas_figures(argv[:argv.index("--")])
        launches = traced_launches(argv[argv.index("--") + 1:])
    except OSError as e:
        raise SystemExit("launch_limits.py: %s: %s" % (e.filename, e.strerror))
    if not figures:
        raise SystemExit("launch_limits.py: no kernel in the ptxas logs (built with -Xptxas -v?)")
    if not launches:
        raise SystemExit("launch_limits.py: no `kernel NAME GRID BLOCK SMEM` line in the traces")
    fit = bad = 0
    for name in sorted(launches):
        threads, dyn = launches[name]
        if name not in figures:
            print("%-32s %5d threads: no ptxas figures (a kernel of CUB or not built by nvcc?)" % (name, threads))
            bad += 1
            continue
        regs, smem = figures[name]
        need = block_registers(regs, threads)
        why = []
        if need > REGS_PER_BLOCK:
            why.append("%d registers for the block, more than %d" % (need, REGS_PER_BLOCK))
        if smem + dyn > SMEM_PER_BLOCK:
            why.append("%d bytes of shared memory, more than %d" % (smem + dyn, SMEM_PER_BLOCK))
        print("%-32s %5d threads %4d registers %6d B shared  %5d of %d block registers%s" %
              (name, threads, regs, smem + dyn, need, REGS_PER_BLOCK, ": DOES NOT FIT: " + "; ".join(why) if why else ""))
        if why:
            bad += 1
        else:
            fit += 1
    print("launch limits: %d kernels fit, %d do not" % (fit, bad))
    return 0 if fit > 0 and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
