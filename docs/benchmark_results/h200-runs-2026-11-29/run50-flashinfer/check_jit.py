"""Generate (but do not compile) the JIT specs that MultiLevelCascadeAttentionWrapper
needs for bf16 / head_dim 128 / paged KV, write their build.ninja files, and check that
every source file they reference exists.  No GPU needed; set FLASHINFER_CUDA_ARCH_LIST
(e.g. "9.0") when no GPU is visible.  Usage:  python3 check_jit.py [--compile]
"""
import os, re, subprocess, sys
import torch
import flashinfer
from flashinfer.jit import env as jit_env
from flashinfer.jit.cascade import gen_cascade_module
from flashinfer.jit.attention.modules import (
    _gen_batch_prefill_primary_module,
    _gen_batch_prefill_independent_paged_module,
    gen_batch_prefill_module,
)

args = (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
        128, 128, 0, False, False, False, False)
specs = {
    "cascade (merge_state)": gen_cascade_module(),
    "fa2 batch prefill (paged+ragged, equal K/V strides)": _gen_batch_prefill_primary_module("fa2", *args),
    "fa2 batch prefill (paged, independent K/V strides)": _gen_batch_prefill_independent_paged_module("fa2", *args),
    "fa3 batch prefill (sm90, picked by backend='auto' on Hopper when max q_len > 64)": gen_batch_prefill_module("fa3", *args),
}
print("flashinfer", flashinfer.__version__, "at", os.path.dirname(flashinfer.__file__))
print("JIT dir:", jit_env.FLASHINFER_JIT_DIR)
ok = True
for label, spec in specs.items():
    spec.write_ninja()
    missing = [str(p) for p in spec.sources if not os.path.exists(p)]
    txt = open(spec.ninja_path).read()
    incs = re.findall(r"(?:-I|-isystem )(\S+)", txt)
    bundle_incs = [i for i in incs if "flashinfer/data" in i]
    missing_incs = [i for i in bundle_incs if not os.path.isdir(i) and not i.endswith("spdlog/include")]
    print(f"- {label}\n    name={spec.name}\n    sources={len(spec.sources)} missing={missing}\n"
          f"    missing include dirs={missing_incs}\n    ninja={spec.ninja_path}")
    ok &= not missing and not missing_incs
    if "--compile" in sys.argv:
        spec.build_and_load()
        print("    built + loaded OK")
print("ALL OK" if ok else "PROBLEMS FOUND")
sys.exit(0 if ok else 1)
