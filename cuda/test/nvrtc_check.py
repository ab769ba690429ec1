#!/usr/bin/env python3
"""Compiles the oxccl kernels with NVRTC, as crates/oxccl-cuda does, for every
dtype x op module and the given architectures; fails on any error or warning
(a non-empty log). Needs libnvrtc.so (pip install nvidia-cuda-nvrtc-cu12).

    python3 cuda/test/nvrtc_check.py [--arch 80 --arch 90] [--ptx-dir DIR]

Finds libnvrtc through $OXCCL_NVRTC_LIB, then the pip package, then the
loader's search path.
"""
import argparse
import ctypes
import glob
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA = os.path.dirname(HERE)
# The order crates/oxccl-cuda concatenates them in.
SOURCES = ["args.h", "oxccl.cuh", "reduce.cu", "collective.cu", "stage.cu", "program.cu"]
ENTRY_POINTS = ["oxccl_reduce", "oxccl_collective", "oxccl_signal_host", "oxccl_wait_host"]
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
          "f8e4m3", "f8e5m2"]
OPS = ["sum", "prod", "max", "min"]


def load_nvrtc():
    candidates = []
    if os.environ.get("OXCCL_NVRTC_LIB"):
        candidates.append(os.environ["OXCCL_NVRTC_LIB"])
    try:
        import nvidia.cuda_nvrtc as pkg
        for d in pkg.__path__:
            candidates += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    candidates += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    for c in candidates:
        try:
            return ctypes.CDLL(c), c
        except OSError:
            continue
    sys.exit("libnvrtc not found: pip install nvidia-cuda-nvrtc-cu12 or set OXCCL_NVRTC_LIB")


def check(lib, rc, what):
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}")


def compile_one(lib, source, arch, dtype, op):
    prog = ctypes.c_void_p()
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"oxccl.cu", 0, None, None), "create")
    opts = [f"--gpu-architecture=compute_{arch}", "-std=c++17", "-default-device", "-DOXCCL_NVRTC",
            f"-DOXCCL_DTYPE={dtype}", f"-DOXCCL_OP={op}"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx = b""
    if rc == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, buf)
        ptx = buf.value
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace").strip(), ptx.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", type=int, help="compute capability, e.g. 80 (default: 80 and 90)")
    ap.add_argument("--dtype", action="append", type=int, help="only these dtypes (0..11)")
    ap.add_argument("--op", action="append", type=int, help="only these ops (0..3)")
    ap.add_argument("--ptx-dir", help="write each module's PTX here")
    args = ap.parse_args()
    lib, path = load_nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"NVRTC {major.value}.{minor.value} from {path}")
    source = "".join(open(os.path.join(CUDA, f)).read() + "\n" for f in SOURCES).encode()
    failed = 0
    times = []
    for arch in args.arch or [80, 90]:
        for dtype in args.dtype or range(12):
            for op in args.op or range(4):
                t0 = time.monotonic()
                rc, log, ptx = compile_one(lib, source, arch, dtype, op)
                dt = time.monotonic() - t0
                times.append(dt)
                name = f"compute_{arch} {DTYPES[dtype]:>8} {OPS[op]:>4}"
                missing = [e for e in ENTRY_POINTS if f".entry {e}(" not in ptx]
                if rc != 0 or log or missing:
                    failed += 1
                    print(f"FAIL {name} ({dt:.2f} s): rc {rc}, missing entry points {missing}\n{log}\n")
                    continue
                print(f"ok   {name} {dt:.2f} s, {len(ptx)} bytes of PTX")
                if args.ptx_dir:
                    os.makedirs(args.ptx_dir, exist_ok=True)
                    with open(os.path.join(args.ptx_dir, f"oxccl_{arch}_{dtype}_{op}.ptx"), "w") as f:
                        f.write(ptx)
    print(f"{len(times) - failed} of {len(times)} modules compiled with an empty log; "
          f"{min(times):.2f}..{max(times):.2f} s per module, {sum(times):.1f} s in all")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
