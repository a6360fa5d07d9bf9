"""gpu_e2e_bench.py with each decode layer's attention output handed to mx.async_eval as soon as it is built
(arm "async"), so the GPU starts a step's first layers while Python builds the rest; arm "sync" is the bench as is.
Usage: e2e_async.py sync|async [gpu_e2e_bench args]"""
import sys
import mlx.core as mx
from mlxcel.engine import model

if sys.argv[1] == "async":
    attend = model.PagedLayerCache.attend

    def attend_and_launch(self, queries, scale):
        out = attend(self, queries, scale)
        if self.ctx.decode:
            mx.async_eval(out)
        return out
    model.PagedLayerCache.attend = attend_and_launch
sys.argv = [sys.argv[0]] + sys.argv[2:]
import gpu_e2e_bench
gpu_e2e_bench.main()
