"""Host encode of a custom-kernel launch on MLX's CUDA backend: the timing
chain alone, plus one trivial custom kernel (short source, or the same
kernel with 12 KB of comment in its header: MLX hashes the whole source on
every launch), plus three of them in a row. Per-call medians (us)."""
import json, sys
import mlx.core as mx
import gpu_attention_bench as b

cell = b.Cell(8192, 256, 32)
SOURCE = """
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < x_shape[0] * x_shape[1] * x_shape[2]) out[i] = x[i];
"""
short = mx.fast.cuda_kernel(name="probe_short", input_names=["x"], output_names=["out"], source=SOURCE, header="")
padded = mx.fast.cuda_kernel(name="probe_padded", input_names=["x"], output_names=["out"], source=SOURCE,
                             header="".join(f"// padding line {i:05d} .......................................\n"
                                            for i in range(200)))

def launch(kernel, x):
    return kernel(inputs=[x], grid=(x.size, 1, 1), threadgroup=(256, 1, 1), output_shapes=[x.shape],
                  output_dtypes=[x.dtype])[0]

def arm(kernel, n):
    def call(i, dep=None):
        x = cell.query(i, dep)
        for _ in range(n):
            x = launch(kernel, x)
        return x
    return call

calls = {"chain": cell.chain_only, "short_x1": arm(short, 1), "padded_x1": arm(padded, 1), "short_x3": arm(short, 3),
         "padded_x3": arm(padded, 3)}
out = []
for rnd in range(2):
    stats = b.measure_all(calls, 10)
    r = {"round": rnd, **{f"{n}_{k}": round(s[k] * 1e6, 1) for n, s in stats.items() for k in ("s", "encode_s", "host_s")}}
    out.append(r)
    print(json.dumps(r), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
