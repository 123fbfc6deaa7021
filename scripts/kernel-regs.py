#!/usr/bin/env python3
"""Compile the embedded CUDA kernels with NVRTC for sm_90a and run `ptxas -v` on them, without a GPU.

Prints registers, spill bytes and shared memory per kernel, and ptxas's wgmma serialisation
warnings (C7510-C7520), for each variant given. Uses the NVRTC and ptxas that the project's
PyTorch 2.11.0 virtualenv ships (scripts/setup-libtorch.sh installs it), so a kernel change can be
checked here before a device call.

    python3 scripts/kernel-regs.py                      # attn_fwd.cu attn_bwd.cu quant.cu, default variant
    python3 scripts/kernel-regs.py -D NVFP4=1 attn_fwd.cu
    python3 scripts/kernel-regs.py --dir old/cuda       # sources from another directory (A/B)
    python3 scripts/kernel-regs.py --per-score          # v4 forward: SASS instructions per score
                                                        # of the interior and the masked key-tile
                                                        # loops, by class (--full: both loops of
                                                        # the one production build)
    python3 scripts/kernel-regs.py --bwd-per-step       # v4 backward: SASS instructions per step
                                                        # of its step loops, by class
    python3 scripts/kernel-regs.py --bwd-per-item       # v4 backward: SASS instructions per item
                                                        # outside the steps (K/V wait, transposes,
                                                        # the item's end), MHA and GQA, by class
    python3 scripts/kernel-regs.py -D HEAD_DIM=128 --lines quant_e4m3 quant.cu
                                                        # a kernel's largest loop (--whole: all of
                                                        # it) counted per CUDA source line
"""
import argparse
import re
import ctypes
import glob
import difflib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find(pattern):
    hits = sorted(glob.glob(os.path.join(ROOT, ".venv", "lib", "python3*", "site-packages", pattern)))
    if not hits:
        sys.exit(f"kernel-regs: {pattern} not found under .venv (run scripts/setup-libtorch.sh first)")
    return hits[0]


def load_nvrtc():
    libdir = os.path.dirname(find("nvidia/cu13/lib/libnvrtc.so.13"))
    # NVRTC dlopens its builtins library by name: load it first from the same directory.
    ctypes.CDLL(os.path.join(libdir, "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(os.path.join(libdir, "libnvrtc.so.13"))


class NvrtcError(Exception):
    pass


def nvrtc_ptx(lib, src_dir, name, defines, quiet=False):
    headers = sorted(f for f in os.listdir(src_dir) if f.endswith(".cuh"))
    texts = [open(os.path.join(src_dir, h), "rb").read() for h in headers]
    prog = ctypes.c_void_p()
    hdr_src = (ctypes.c_char_p * len(headers))(*texts)
    hdr_names = (ctypes.c_char_p * len(headers))(*[h.encode() for h in headers])
    src = open(os.path.join(src_dir, name), "rb").read()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), len(headers), hdr_src, hdr_names)
    assert rc == 0, f"nvrtcCreateProgram rc={rc}"
    opts = [b"--gpu-architecture=sm_90a", b"-std=c++17", b"-lineinfo"] + [f"-D{d}".encode() for d in defines]
    copts = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), copts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        if quiet:
            raise NvrtcError(log.value.decode())
        sys.exit(f"{name} [{' '.join(defines)}]: NVRTC failed\n{log.value.decode()}")
    # With a real sm_ target NVRTC also runs ptxas; its info lines are printed below, per kernel.
    for line in log.value.decode().splitlines():
        if line.strip() and not line.startswith("ptxas") and not quiet:
            print(line)
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", default=["attn_fwd.cu", "attn_bwd.cu", "quant.cu"])
    ap.add_argument("-D", dest="defines", action="append", default=[], help="NAME=VALUE define (repeatable)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "flamia-kernels", "cuda"), help="kernel source directory")
    ap.add_argument("--keep", help="write the PTX files into this directory")
    ap.add_argument("--sass", action="store_true",
                    help="also count SASS instructions per kernel: branches (BRA), tensor-core MMAs "
                         "(QGMMA/HGMMA), barriers (BAR), warpgroup waits (WARPGROUP)")
    ap.add_argument("--per-score", action="store_true",
                    help="v4 forward: compile attn_fwd_v4.cu with only the interior (mask-free) or only the "
                         "masked tile loop (FWD_INTERIOR_ONLY / FWD_MASKED_ONLY: census builds, their "
                         "results are wrong) and print the SASS instructions of that key-tile loop per "
                         "score, by instruction class")
    ap.add_argument("--full", action="store_true",
                    help="with --per-score: count both key-tile loops in the one full build of each scale mode "
                         "(no census defines), each loop named interior or masked by its -inf selects, so a "
                         "change to one loop that moves ptxas's code for the other shows (session 27: code "
                         "added to the backward's masked step cost its interior step 19 SASS)")
    ap.add_argument("--bwd-per-step", action="store_true",
                    help="v4 backward: the SASS instructions of each step loop (interior and masked: the loops "
                         "whose body holds one step's wgmma: at least 16, 12 at HEAD_DIM=64) per consumer thread per step, "
                         "by class")
    ap.add_argument("--max-step-local", type=int, default=None, metavar="N",
                    help="with --bwd-per-step (or --per-score: the forward's key-tile loops): exit 1 when a "
                         "loop holds more than N local-memory instructions (LDL / STL: values ptxas carries "
                         "around the loop in local memory; session 46 found 18 per step in the backward's long "
                         "documents' default build, 5-7%% slower)")
    ap.add_argument("--opcodes", action="store_true",
                    help="with --bwd-per-step or --per-score: also every opcode of each loop with its count (session 26 "
                         "found the dQ store's 32 FSEL and the exponents' 16 VIMNMX that way)")
    ap.add_argument("--bwd-per-item", action="store_true",
                    help="v4 backward: census builds without steps (BWD_CENSUS_ITEM: 2 = MHA, no GQA sums; 1 = "
                         "with them; their results are wrong): the SASS instructions of the consumer's item loop "
                         "per consumer thread per item, by class")
    ap.add_argument("--lines", metavar="KERNEL",
                    help="the SASS of KERNEL's largest loop (its longest backward branch; --whole: the whole "
                         "kernel) counted per CUDA source line (nvdisasm line info), most first, with each "
                         "line's top opcodes: where a loop's instructions come from (session 31 found the "
                         "quantiser's chunk bookkeeping, ~150 of its item loop's 1,107 SASS, this way); "
                         "one source file, e.g. -D HEAD_DIM=128 --lines quant_e4m3 quant.cu")
    ap.add_argument("--same-sass", metavar="DIR",
                    help="compile each source from --dir and from DIR (e.g. an older commit's sources: `git "
                         "archive REV flamia-kernels/cuda | tar -x -C /tmp/old`) with the same defines and say "
                         "whether the SASS of every kernel is the same, instruction for instruction (addresses "
                         "and line info aside), else where they first differ: a refactor's check that the "
                         "build a measurement was taken on is unchanged (session 38)")
    ap.add_argument("--step-diff", metavar="DIR",
                    help="with --bwd-per-step: each step loop's SASS from --dir against the same loop built from "
                         "DIR's sources (same defines), registers and predicates renamed away, as a unified "
                         "diff: whether two builds' step code differs beyond register allocation (session 47: "
                         "the long build's loops are session 43's but for one UIADD3 and shared-memory offsets "
                         "24 bytes higher)")
    ap.add_argument("--smem-offsets", metavar="STRUCT",
                    help="the byte offset of each top-level field of STRUCT (e.g. BwdV4Smem) as the source and "
                         "defines lay it out, with the offset mod 128 (the shared-memory bank line), and its "
                         "size; with --dir-b DIR the same from DIR's sources beside it: where a layout moved "
                         "(session 48: today's small arrays 24 bytes past session 43's)")
    ap.add_argument("--dir-b", metavar="DIR", help="with --smem-offsets: a second source directory to compare")
    ap.add_argument("--whole", action="store_true", help="with --lines: count the whole kernel, not its largest loop")
    ap.add_argument("--top", type=int, default=40, help="with --lines: how many source lines to print (default 40)")
    a = ap.parse_args()
    if a.smem_offsets:
        return smem_offsets(a)
    if a.same_sass:
        return same_sass(a)
    if a.lines:
        return per_line(a)
    if a.bwd_per_item:
        return bwd_per_item(a)
    if a.per_score:
        return per_score(a)
    if a.bwd_per_step:
        return bwd_per_step(a)
    lib = load_nvrtc()
    ptxas = find("torch/bin/ptxas")
    cuobjdump = find("triton/backends/nvidia/bin/cuobjdump") if a.sass else None
    for name in a.sources:
        ptx = nvrtc_ptx(lib, a.dir, name, a.defines)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(a.keep or tmp, name + ".ptx")
            open(path, "wb").write(ptx)
            cubin = os.path.join(tmp, "k.cubin")
            r = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", cubin], capture_output=True, text=True)
            sass = subprocess.run([cuobjdump, "--dump-sass", cubin], capture_output=True, text=True).stdout \
                if cuobjdump and r.returncode == 0 else ""
        if r.returncode != 0:
            sys.exit(f"{name}: ptxas failed\n{r.stderr}")
        fn = None
        for line in r.stderr.splitlines():
            if "Compiling entry function" in line:
                fn = line.split("'")[1]
            elif "Used" in line or "spill" in line:
                print(f"{name:12s} {fn:16s} {line.split(':', 1)[-1].strip()}")
            elif "C75" in line or "warning" in line.lower():
                print(f"{name:12s} {fn or '':16s} {line.strip()}")
        counts, fn = {}, None
        for line in sass.splitlines():
            if "Function :" in line:
                fn = line.split(":", 1)[1].strip()
                counts[fn] = {k: 0 for k in ("BRA", "GMMA", "BAR", "WARPGROUP", "instructions")}
            elif fn and line.strip().startswith("/*") and "*/" in line:
                words = line.split("*/", 1)[1].split()
                if words and words[0].startswith("@"):  # predicate guard
                    words = words[1:]
                if not words or words[0].startswith("/*"):
                    continue
                op = words[0]
                c = counts[fn]
                c["instructions"] += 1
                for k in ("BRA", "BAR", "WARPGROUP"):
                    c[k] += op.startswith(k)
                c["GMMA"] += "GMMA" in op
        for fn, c in sorted(counts.items()):
            print(f"{name:12s} {fn:16s} SASS: " + ", ".join(f"{k} {v}" for k, v in c.items()))


def struct_fields(src, struct):
    """The top-level field names of `struct` in the source text (preprocessor lines kept out, so
    a field under an #if that the defines leave out fails to compile and is dropped below)."""
    m = re.search(r"struct\s+(?:alignas\(\d+\)\s+)?" + re.escape(struct) + r"\s*\{", src)
    if not m:
        sys.exit(f"kernel-regs: struct {struct} not found")
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    names = []
    for line in src[m.end():i - 1].splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith("#") or "(" in line:
            continue
        for decl in line.rstrip(";").split(","):
            w = re.findall(r"([A-Za-z_]\w*)\s*(?:\[|$)", decl.strip())
            if w:
                names.append(w[0])
    return names


def struct_offsets(lib, src_dir, name, defines, struct):
    """{field: offset} and sizeof of `struct`, read from the PTX of a kernel that stores each
    field's address difference (NVRTC has no offsetof): fields that the defines leave out are
    retried without."""
    src = open(os.path.join(src_dir, name)).read()
    fields = struct_fields(src, struct)
    with tempfile.TemporaryDirectory() as tmp:
        for f in os.listdir(src_dir):
            if f.endswith(".cuh"):
                shutil.copy(os.path.join(src_dir, f), tmp)
        while True:
            body = "".join(f"  o[{i}] = (int)((char*)&s->{f} - (char*)s);\n" for i, f in enumerate(fields))
            probe = (f"\nextern \"C\" __global__ void kernel_regs_offsets(int* o, {struct}* s) {{\n{body}"
                     f"  o[{len(fields)}] = (int)sizeof({struct});\n}}\n")
            open(os.path.join(tmp, name), "w").write(src + probe)
            try:
                ptx = nvrtc_ptx(lib, tmp, name, defines, quiet=True).decode()
                break
            except NvrtcError as e:
                gone = [f for f in fields if re.search(rf'"{f}" is undefined|has no member "{f}"', str(e))]
                if not gone:
                    sys.exit(f"kernel-regs: the offsets probe of {struct} did not compile\n{e}")
                fields = [f for f in fields if f not in gone]
    k = ptx[ptx.index(".entry kernel_regs_offsets"):]
    regs = dict(re.findall(r"mov\.u32\s+(%r\d+),\s*(\d+);", k))
    out = {}
    for off, v in re.findall(r"st\.global\.u32\s+\[%rd\d+(?:\+(\d+))?\],\s*(%r\d+|\d+);", k):
        out[(fields + ["sizeof"])[int(off or 0) // 4]] = int(regs.get(v, v))
    missing = [f for f in fields + ["sizeof"] if f not in out]
    if missing:  # (a store form the parser does not read, e.g. a vector store: say so, never guess)
        sys.exit(f"kernel-regs: the offsets of {', '.join(missing)} were not found in the probe's PTX")
    return out


def smem_offsets(a):
    lib = load_nvrtc()
    for name in a.sources:
        cols = [(a.dir, struct_offsets(lib, a.dir, name, a.defines, a.smem_offsets))]
        if a.dir_b:
            cols.append((a.dir_b, struct_offsets(lib, a.dir_b, name, a.defines, a.smem_offsets)))
        print(f"{name} {a.smem_offsets}: offset (mod 128) per field" + "".join(f" | {d}" for d, _ in cols))
        keys = list(cols[0][1]) + [k for k in (cols[1][1] if len(cols) > 1 else {}) if k not in cols[0][1]]
        keys = sorted(keys, key=lambda k: (k == "sizeof", min(c.get(k, 1 << 30) for _, c in cols)))
        for k in keys:
            row = [f"{c[k]:>8} ({c[k] % 128:3})" if k in c else f"{'-':>14}" for _, c in cols]
            moved = len(cols) > 1 and all(k in c for _, c in cols) and cols[0][1][k] != cols[1][1][k]
            print(f"  {k:14s} " + "  ".join(row) + (f"  {cols[0][1][k] - cols[1][1][k]:+d}" if moved else ""))


# Scores per consumer thread per key tile of the v4 forward (64 x 128 tile, 128 threads).
V4_SCORES_PER_THREAD = 64
CLASSES = [("MMA", ("QGMMA", "HGMMA")), ("FFMA", ("FFMA",)), ("FMUL", ("FMUL",)), ("FADD", ("FADD",)),
           ("FMNMX", ("FMNMX",)), ("MUFU", ("MUFU",)), ("cvt", ("F2FP", "F2F", "I2F", "F2I")),
           ("SHFL", ("SHFL",)), ("PRMT/LOP", ("PRMT", "LOP3", "SHF", "IMAD", "IADD", "ISETP", "SEL", "FSEL", "FSETP", "MOV")),
           ("sync", ("SYNCS", "WARPGROUP", "BAR", "DEPBAR", "WARPSYNC", "BRA"))]


def disassembly(lib, src_dir, name, defines, ptxas_flag, tool, tool_args):
    """The module of `name` (NVRTC PTX -> ptxas with `ptxas_flag`) as the disassembler `tool`
    (a path below site-packages, run with `tool_args` and the cubin) prints it."""
    ptx = nvrtc_ptx(lib, src_dir, name, defines)
    ptxas = find("torch/bin/ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        open(path, "wb").write(ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", ptxas_flag, path, "-o", cubin], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{name}: ptxas failed\n{r.stderr}")
        return subprocess.run([find(tool)] + tool_args + [cubin], capture_output=True, text=True).stdout


def same_sass(a):
    """--same-sass: every source's SASS from --dir against the same from another directory."""
    lib = load_nvrtc()
    differ = 0
    for name in a.sources:
        texts = []
        for d in (a.dir, a.same_sass):
            sass = disassembly(lib, d, name, a.defines, "-v", "triton/backends/nvidia/bin/cuobjdump", ["--dump-sass"])
            # the instructions alone: no addresses, encodings or headers
            ins = (t.split("*/", 1)[1].split(";", 1)[0].strip() for t in (l.strip() for l in sass.splitlines())
                   if t.startswith("/*") and "*/" in t)
            texts.append([t for t in ins if t and not t.startswith("/*")])
        x, y = texts
        if x == y:
            print(f"{name}: the same SASS ({len(x)} instructions) [{' '.join(a.defines) or 'no defines'}]")
            continue
        differ += 1
        i = next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        print(f"{name}: the SASS differs ({len(x)} against {len(y)} instructions), first at instruction {i}:")
        print(f"  {a.dir}: {x[i] if i < len(x) else '(end)'}")
        print(f"  {a.same_sass}: {y[i] if i < len(y) else '(end)'}")
    return 1 if differ else 0


def sass_lines(lib, src_dir, name, defines, function):
    """(address, opcode, text) of the SASS of one kernel (`function`) of the module. Addresses are
    per function, so the kernels of one module overlap: counting by address range alone mixed the
    module's small kernels into the ranges of the big one's loops."""
    sass = disassembly(lib, src_dir, name, defines, "-v", "triton/backends/nvidia/bin/cuobjdump", ["--dump-sass"])
    out = []  # (address, opcode, text)
    fn = None
    for line in sass.splitlines():
        t = line.strip()
        if "Function :" in t:
            fn = t.split(":", 1)[1].strip()
            continue
        if fn != function or not t.startswith("/*") or "*/" not in t:
            continue
        addr, rest = t[2:].split("*/", 1)
        words = rest.replace(";", " ").split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if not words or words[0].startswith("/*"):
            continue
        try:
            out.append((int(addr.strip(), 16), words[0], rest))
        except ValueError:
            pass
    if not out:
        sys.exit(f"{name}: no SASS for kernel {function}")
    return out


def per_line(a):
    """--lines: a kernel's SASS (its largest loop, or --whole) counted per CUDA source line."""
    if len(a.sources) != 1:
        sys.exit("--lines takes one source file")
    name = a.sources[0]
    text = disassembly(load_nvrtc(), a.dir, name, a.defines, "-lineinfo", "triton/backends/nvidia/bin/nvdisasm",
                       ["--print-line-info", "-c"])
    lines = text.splitlines()
    head = f".text.{a.lines}:"
    if head not in lines:
        sys.exit(f"{name}: no kernel {a.lines} in the module")
    start = lines.index(head)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("//-----")), len(lines))
    ins, labels, pending, where = [], {}, [], None  # ins: (address, opcode, rest, (file, line))
    for line in lines[start + 1:end]:
        m = re.match(r"(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r'\s*//## File "(.*)", line (\d+)', line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line)
        if m:
            addr = int(m.group(1), 16)
            ins.append((addr, m.group(3), m.group(4), where))
            for label in pending:
                labels[label] = addr
            pending = []
    lo, hi = ins[0][0], ins[-1][0]
    if not a.whole:
        edges = [(labels[t], addr) for addr, op, rest, _ in ins if op == "BRA"
                 for t in re.findall(r"\.L_x_\d+", rest) if t in labels and labels[t] < addr]
        if not edges:
            sys.exit(f"{a.lines}: no loop (no backward branch); use --whole")
        lo, hi = max(edges, key=lambda e: e[1] - e[0])
    counts, ops = {}, {}
    for addr, op, _, w in ins:
        if lo <= addr <= hi:
            counts[w] = counts.get(w, 0) + 1
            ops.setdefault(w, {})
            ops[w][op] = ops[w].get(op, 0) + 1
    sources = {}
    print(f"{a.lines} ({name} {' '.join(a.defines)}): {'whole kernel' if a.whole else 'largest loop'} "
          f"[{lo:#x}, {hi:#x}], {sum(counts.values())} SASS")
    for w, n in sorted(counts.items(), key=lambda x: -x[1])[:a.top]:
        f, ln = w if w else ("?", 0)
        if f not in sources:
            p = os.path.join(a.dir, f)
            sources[f] = open(p).read().splitlines() if os.path.exists(p) else []
        src = sources[f][ln - 1].strip()[:60] if 0 < ln <= len(sources[f]) else ""
        top = ", ".join(f"{o} {c}" for o, c in sorted(ops[w].items(), key=lambda x: -x[1])[:4])
        print(f"{n:5d}  {f}:{ln}  {src}  | {top}")


def back_edges(ins):
    """(target, address) of every backward branch of the SASS."""
    out = []
    for addr, op, text in ins:
        if op != "BRA":
            continue
        for w in text.replace(",", " ").split():
            if not w.startswith("0x"):
                continue
            try:
                t = int(w, 16)
            except ValueError:
                continue
            if t < addr:
                out.append((t, addr))
    return out


def loops_with(ins, n_gmma):
    """(start, end) address ranges of the innermost backward branches whose body holds at least
    n_gmma GMMAs."""
    out = [(t, addr) for t, addr in back_edges(ins)
           if sum(1 for a2, o2, _ in ins if t <= a2 <= addr and "GMMA" in o2) >= n_gmma]
    # innermost first, no duplicates of the same body start
    out.sort(key=lambda r: r[1] - r[0])
    seen, keep = set(), []
    for r in out:
        if r[0] not in seen:
            seen.add(r[0])
            keep.append(r)
    # innermost only: drop a range that contains or overlaps a smaller one (a back edge that jumps
    # over out-of-line code, e.g. the item end placed inside a loop's address range)
    def overlaps(r, o):
        return o != r and o[0] <= r[1] and r[0] <= o[1] and (o[1] - o[0]) < (r[1] - r[0])
    inner = [r for r in keep if not any(overlaps(r, o) for o in keep)]
    return sorted(inner)


def class_counts(body):
    counts = {k: 0 for k, _ in CLASSES}
    other = 0
    for op in body:
        for k, prefixes in CLASSES:
            if op.startswith(prefixes):
                counts[k] += 1
                break
        else:
            other += 1
    return counts, other


def print_opcodes(body):
    """Every opcode of a loop body with its count, most frequent first (--opcodes)."""
    ops = {}
    for op in body:
        ops[op] = ops.get(op, 0) + 1
    print("   opcodes: " + ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda x: (-x[1], x[0]))))


def bwd_per_step(a):
    lib = load_nvrtc()
    ins = sass_lines(lib, a.dir, "attn_bwd_v4.cu", a.defines, "attn_bwd_v4")
    # one step's wgmma: S^T and dP^T 2 x HEAD_DIM / 32 (K slices of the head dim), dQ 4, dV and dK
    # at least 4 (more when split into pieces)
    hd = next((int(d.split("=", 1)[1]) for d in a.defines if d.startswith("HEAD_DIM=")), 128)
    n_gmma = 2 * hd // 32 + 8
    loops = loops_with(ins, n_gmma)
    if not loops:
        sys.exit(f"no loop with one step's {n_gmma} wgmma found in the attn_bwd_v4 SASS")
    over = 0
    for lo, hi in loops:
        body = [op for addr, op, _ in ins if lo <= addr <= hi]
        texts = [t for addr, _, t in ins if lo <= addr <= hi]
        counts, other = class_counts(body)
        # the causal mask's selects mark the diagonal-step loop; a step stores nothing to global
        # memory, so global stores inside a loop's address range are out-of-line code of the same
        # kernel that ptxas placed there (none today), not step work
        masked = sum(1 for t in texts if "-INF" in t) > 0
        stg = sum(1 for op in body if op.startswith("STG"))
        kind = "masked (diagonal) steps" if masked else "interior steps"
        note = f"; the range also holds {stg} global stores of out-of-line code, so it over-counts" if stg else ""
        # spilled values carried around the loop (LDL.LU at their use, STL after their update)
        local = sum(1 for op in body if op.startswith(("LDL", "STL")))
        print(f"attn_bwd_v4 step loop [{lo:#x}, {hi:#x}], {kind}: {len(body)} SASS instructions per consumer thread "
              f"per step (64 queries x 64 keys per warpgroup: {len(body) / 32:.1f} per score){note}")
        print("   " + ", ".join(f"{k} {v}" for k, v in counts.items()) + f", other {other}"
              + f" (of which local-memory LDL/STL {local})")
        if a.max_step_local is not None and local > a.max_step_local:
            print(f"   ^ {local} local-memory instructions in this step loop, more than the {a.max_step_local} allowed")
            over += 1
        if a.opcodes:
            print_opcodes(body)
    if a.step_diff:
        other = sass_lines(lib, a.step_diff, "attn_bwd_v4.cu", a.defines, "attn_bwd_v4")
        theirs = loops_with(other, n_gmma)
        if len(theirs) != len(loops):
            print(f"step-diff: {len(loops)} step loops here, {len(theirs)} in {a.step_diff}")
            return 1
        for (lo, hi), (olo, ohi) in zip(loops, theirs):
            mine = [normalised(t) for addr, _, t in ins if lo <= addr <= hi]
            them = [normalised(t) for addr, _, t in other if olo <= addr <= ohi]
            diff = list(difflib.unified_diff(them, mine, f"{a.step_diff} [{olo:#x}, {ohi:#x}]",
                                             f"{a.dir} [{lo:#x}, {hi:#x}]", n=0, lineterm=""))
            changed = sum(1 for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---")))
            print(f"step-diff [{lo:#x}, {hi:#x}]: {changed} lines differ from {a.step_diff}'s loop"
                  + (" (the same code)" if not changed else ""))
            for d in diff:
                print("   " + d)
    return 1 if over else 0


def normalised(text):
    """A SASS instruction without its register and predicate names (and branch targets'
    addresses, which move with the code around a loop): what two builds' loops share when only
    the allocation differs."""
    t = text.split(";")[0].strip()
    t = re.sub(r"\bU?R\d+\b", "R", t)
    t = re.sub(r"\bU?P\d\b", "P", t)
    return re.sub(r"\b(BRA|BSSY B\d+,|CALL\.REL(?:\.NOINC)?) (`?\(?)0x[0-9a-f]+", r"\1 \2ADDR", t)


def bwd_per_item(a):
    lib = load_nvrtc()
    for mode, tag in (("2", "MHA"), ("1", "GQA sums included")):
        ins = sass_lines(lib, a.dir, "attn_bwd_v4.cu", a.defines + [f"BWD_CENSUS_ITEM={mode}"], "attn_bwd_v4")
        # the consumer's item loop (census builds hold the consumers' code alone): the first back
        # edge after the item end's last global store that jumps to before its first one (later
        # back edges come from out-of-line blocks, e.g. the shuffles' divergent fallbacks)
        stg = [addr for addr, op, _ in ins if op.startswith("STG")]
        if len(stg) < 8:
            sys.exit("the item end's global stores were not found in the attn_bwd_v4 census SASS")
        ranges = [(t, addr) for t, addr in back_edges(ins) if addr > max(stg) and t < min(stg)]
        if not ranges:
            sys.exit("no item loop around the item end's stores found in the attn_bwd_v4 census SASS")
        lo, hi = min(ranges, key=lambda r: r[1])
        body = [op for addr, op, _ in ins if lo <= addr <= hi]
        counts, other = class_counts(body)
        n_stg = sum(1 for op in body if op.startswith("STG"))
        print(f"attn_bwd_v4 item loop [{lo:#x}, {hi:#x}] ({tag}): {len(body)} SASS instructions per consumer "
              f"thread per item outside the steps ({n_stg} global stores)")
        print("   " + ", ".join(f"{k} {v}" for k, v in counts.items()) + f", other {other}")


def per_score(a):
    lib = load_nvrtc()
    over = 0
    if a.full:
        builds = (("", []), ("", ["PER_TOKEN_COLS=1"]))
    else:
        builds = (("interior", ["FWD_INTERIOR_ONLY=1"]), ("masked", ["FWD_MASKED_ONLY=1"]),
                  ("interior", ["FWD_INTERIOR_ONLY=1", "PER_TOKEN_COLS=1"]),
                  ("masked", ["FWD_MASKED_ONLY=1", "PER_TOKEN_COLS=1"]))
    for path, extra in builds:
        ins = sass_lines(lib, a.dir, "attn_fwd_v4.cu", extra + a.defines, "attn_fwd_v4")
        # the key-tile loops: the innermost backward branches around one tile's S and PV wgmma
        # (HEAD_DIM / 32 + 4); one per consumer copy (FWD_CW_CONST inlines one per warpgroup)
        hd = next((int(d.split("=", 1)[1]) for d in a.defines if d.startswith("HEAD_DIM=")), 128)
        loops = loops_with(ins, hd // 32 + 4)
        if not loops:
            sys.exit("could not find the key-tile loop's back edge in the SASS")
        tag = "per-token scales" if "PER_TOKEN_COLS=1" in extra else "token-block scales"
        for c, (lo, hi) in enumerate(sorted(loops)):
            body = [op for addr, op, _ in ins if lo <= addr <= hi]
            local = sum(1 for op in body if op.startswith(("LDL", "STL")))
            if a.max_step_local is not None and local > a.max_step_local:
                print(f"attn_fwd_v4 key-tile loop [{lo:#x}, {hi:#x}] ({tag}): {local} local-memory instructions, "
                      f"more than the {a.max_step_local} allowed")
                over += 1
            counts, other = class_counts(body)
            n = len(body)
            copy = f", copy {c}" if len(loops) > 1 and not a.full else ""
            if a.full:
                # the masks' selects of -inf (one per score) name the masked loop; an interior loop
                # has at most a few (a row with no key yet)
                ninf = sum(1 for addr, _, t in ins if lo <= addr <= hi and "-INF" in t)
                path = f"[{lo:#x}, {hi:#x}] {'masked' if ninf > 16 else 'interior'}"
            print(f"attn_fwd_v4 {path} key-tile loop ({tag}{copy}): {n} SASS instructions per thread per tile = "
                  f"{n / V4_SCORES_PER_THREAD:.2f} per score (budget ~12)")
            print("   " + ", ".join(f"{k} {v / V4_SCORES_PER_THREAD:.2f}" for k, v in counts.items())
                  + f", other {other / V4_SCORES_PER_THREAD:.2f}")
            if a.opcodes:
                print_opcodes(body)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
