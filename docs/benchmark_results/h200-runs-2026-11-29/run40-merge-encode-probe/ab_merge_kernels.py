"""A/B: fold_states in one pass (batches of 16, online top: new, working tree) vs max pass + batches of 8
(old, ab_step/cuda_head.py = HEAD). Cascade step and flat launch; interleaved rotated order; two rounds."""
import dataclasses, json, re, sys
import mlx.core as mx
from mlxcel.kernels import cuda, fused

text = open("ab_step/cuda_head.py").read()
src = {n: re.search(n + r' = r"""(.*?)"""', text, re.S).group(1)
       for n in ("HEADER", "PARTIAL_SOURCE", "MERGE_SOURCE", "CASCADE_MERGE_SOURCE")}
p = cuda.KERNELS.platform
old = fused.FusedKernels(dataclasses.replace(p, header=src["HEADER"], partial_source=src["PARTIAL_SOURCE"],
                                             merge_source=src["MERGE_SOURCE"],
                                             cascade_merge_source=src["CASCADE_MERGE_SOURCE"]))
kernels = {"old": old, "new": cuda.KERNELS}
