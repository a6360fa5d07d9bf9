"""The engine end to end on mlx-lm models: same tokens and logits as mlx-lm,
cascade on/off equality, prefix-cache reuse, pages back to baseline."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.generate import stream_generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from mlxcel.engine.model import ModelLoadError, load_model
from mlxcel.engine.scheduler import RequestRejected
from mlxcel.engine.sequence import SamplingParams
from mlxcel.engine.sessions import chat_prompt
from mlxcel.engine.random_model import TINY_QWEN3, generate_random_model
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS

# Float32 model end to end. The paged kernels sum keys in another order than
# mx.fast.scaled_dot_product_attention, so each layer's output differs by
# float32 rounding (~1e-6 relative); over 4 layers the logits (magnitude ~1)
# move by ~1e-5. 2e-4 leaves room for that and still catches any wrong key.
LOGIT_ATOL = 2e-4


def random_prompt(rng, n, vocab=1024):
    return [int(t) for t in rng.integers(3, vocab, n)]


def mlx_lm_greedy(model, prompt, max_tokens):
    """Tokens and per-step logits from mlx-lm's own model, cache and attention."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[:, -1, :]
    tokens, all_logits = [], []
    for _ in range(max_tokens):
        all_logits.append(np.array(logits[0]))
        token = int(mx.argmax(logits, axis=-1).item())
        tokens.append(token)
        logits = model(mx.array([[token]]), cache=cache)[:, -1, :]
    return tokens, all_logits


def engine_greedy_logits(engine, prompts, max_tokens):
    """Generate greedily and keep the logits each step sampled from, per sequence."""
    sampler = engine.runner.sampler
    seen = []   # (sequences, logits) per sampling step
    real = sampler.sample
    sampler.sample = lambda logits, seqs, inputs: seen.append((list(seqs), logits)) or real(logits, seqs, inputs)
    seqs = [engine.submit(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    engine.run_until_idle()
    logits_per_seq = {s.id: [] for s in seqs}
    for rows, logits in seen:
        for row, seq in enumerate(rows):
            logits_per_seq[seq.id].append(np.array(logits[row].astype(mx.float32)))
    return [s.completion_token_ids for s in seqs], [logits_per_seq[s.id] for s in seqs]


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "model"
    spec = replace(TINY_QWEN3, model_type="llama", num_layers=2, seed=7)
    generate_random_model(path, **asdict(spec))
    return path


@pytest.fixture(scope="module")
def llama_loaded(llama_path):
    return load_model(llama_path)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("cascade", [False, True])
def test_tokens_and_logits_match_mlx_lm(family, cascade, tiny_loaded, tiny_model_path, llama_loaded, llama_path,
                                        make_engine):
    loaded, path = (tiny_loaded, tiny_model_path) if family == "qwen3" else (llama_loaded, llama_path)
    reference, _ = mlx_lm.load(str(path))      # mlx-lm's own modules, unfused
    rng = np.random.default_rng()
    shared = random_prompt(rng, 3 * 16 + 5)
    prompts = [shared + random_prompt(rng, n) for n in (3, 20, 9)]
    engine = make_engine(enabled=cascade, min_shared_pages=2, block_size=16, loaded=loaded)
    tokens, logits = engine_greedy_logits(engine, prompts, max_tokens=6)
    for prompt, got_tokens, got_logits in zip(prompts, tokens, logits):
        want_tokens, want_logits = mlx_lm_greedy(reference, prompt, 6)
        assert len(got_logits) == 6
        for step, (a, b) in enumerate(zip(got_logits, want_logits)):
            np.testing.assert_allclose(a, b, atol=LOGIT_ATOL, err_msg=f"step {step}")
        assert got_tokens == want_tokens
    assert any(len(set(t)) > 1 for t in tokens)  # the arms agree on tokens that vary
    launches = engine.metrics.registry.get_sample_value(
        "mlxcel_paged_decode_launches_total", {"path": "cascade"}) or 0
    assert (launches > 0) == cascade


@pytest.mark.parametrize("cascade", [False, True])
def test_bfloat16_steps_are_as_accurate_as_mlx_lm(cascade, tiny_model_path, make_engine):
    """The bfloat16 path (on a CUDA device: the fused layer ops, K/V stored by the q/k/v kernel, the fused
    attention kernels) scored as mlx-lm's own bfloat16 model is: both against a float32 forward pass of the
    same bf16-rounded weights, fed the engine's tokens (so a near-tie cannot make the runs diverge); each
    prompt prefilled in chunks of at most 24 tokens, so middle chunks (which sample nothing) must still write
    their K/V (on a CUDA device the q/k/v kernel stores them, outside any sampled token's graph). Two
    bfloat16 computations round at different points (fused q/k/v and gate/up, the add folded into the norm,
    paged attention), so neither equals the other; the engine's error stays within twice mlx-lm's plus 0.02
    (logits here reach ~5: a few bf16 ulps), and every token is the float32 argmax within that error. (The
    fused kernels decline so small a cascade: with cascade on, a GPU runs flat steps.)"""
    loaded = load_model(tiny_model_path)
    loaded.set_dtype(mx.bfloat16)
    assert loaded.dtype == mx.bfloat16
    stock, _ = mlx_lm.load(str(tiny_model_path))
    stock.set_dtype(mx.bfloat16)
    exact, _ = mlx_lm.load(str(tiny_model_path))
    exact.set_dtype(mx.bfloat16)
    exact.set_dtype(mx.float32)                 # the same rounded weights, float32 arithmetic
    rng = np.random.default_rng()
    shared = random_prompt(rng, 3 * 16 + 5)
    prompts = [shared + random_prompt(rng, n) for n in (3, 20, 9)]
    engine = make_engine(enabled=cascade, min_shared_pages=2, block_size=16, loaded=loaded, max_running=4,
                         max_batched_tokens=24)
    tokens, logits = engine_greedy_logits(engine, prompts, max_tokens=8)
    for prompt, got_tokens, got_logits in zip(prompts, tokens, logits):
        forced = mx.array([prompt + got_tokens[:-1]])
        want = np.array(exact(forced)[0, len(prompt) - 1:])
        theirs = np.array(stock(forced)[0, len(prompt) - 1:].astype(mx.float32))
        ours = np.stack(got_logits)
        bound = 2 * np.abs(theirs - want).max() + 0.02
        assert np.abs(ours - want).max() <= bound
        for step, token in enumerate(got_tokens):
            assert want[step][token] >= want[step].max() - bound
    assert any(len(set(t)) > 1 for t in tokens)  # tokens that vary


def test_engine_generate_equals_mlx_lm_generate(tiny_loaded, tiny_model_path, make_engine):
    prompt = chat_prompt(tiny_loaded.tokenizer, "You answer briefly.", DEFAULT_QUESTIONS[0])
    reference, tokenizer = mlx_lm.load(str(tiny_model_path))
    want = [r.token for r in stream_generate(reference, tokenizer, mx.array(prompt),
                                             max_tokens=12, sampler=make_sampler(0.0))]
    engine = make_engine()
    got = engine.generate([prompt], SamplingParams(max_tokens=12))[0]
    # mlx-lm stops at EOS too, so the engine's stream is the same length.
    assert got == want and len(set(got)) > 1


def shared_prompt_batch(tokenizer, n, system_tokens=200):
    rng = np.random.default_rng()
    system = tokenizer.decode(random_prompt(rng, system_tokens, vocab=900))
    return [chat_prompt(tokenizer, system, q) for q in DEFAULT_QUESTIONS[:n]]


def test_cascade_on_and_off_give_the_same_tokens(tiny_loaded, make_engine):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    off = make_engine(enabled=False)
    on = make_engine(enabled=True, min_shared_pages=2)
    # The arms must agree on tokens that vary: a random system prompt now and then sends the random model
    # into one repeated token on every row, so a few prompts are drawn until the tokens vary.
    for _ in range(5):
        prompts = shared_prompt_batch(tiny_loaded.tokenizer, 4)
        tokens = off.generate(prompts, params)
        if any(len(set(t)) > 1 for t in tokens):
            break
    else:
        pytest.fail("five random system prompts all gave one repeated token")
    assert on.generate(prompts, params) == tokens
    value = on.metrics.registry.get_sample_value
    assert value("mlxcel_paged_decode_launches_total", {"path": "cascade"}) > 0
    assert (off.metrics.registry.get_sample_value(
        "mlxcel_paged_decode_launches_total", {"path": "cascade"}) or 0) == 0
    assert value("mlxcel_cascade_member_sequences_total") >= 2 * value(
        "mlxcel_paged_decode_launches_total", {"path": "cascade"})


def assert_traced_logits_are_the_plain_ones(make_engine, monkeypatch, prefix: int, suffixes: tuple[int, ...],
                                            max_tokens: int, enabled: bool = True, **engine) -> None:
    """Greedy rows behind a shared random prefix, cascade on (``enabled``), the layers untraced then traced
    (MLXCEL_TRACED_LAYERS off, on): the same tokens, which vary, and every step's logits bit for bit."""
    rng = np.random.default_rng()
    system = random_prompt(rng, prefix)
    prompts = [system + random_prompt(rng, n) for n in suffixes]
    runs = {}
    for mode in ("off", "on"):
        monkeypatch.setenv("MLXCEL_TRACED_LAYERS", mode)
        runs[mode] = engine_greedy_logits(make_engine(enabled=enabled, min_shared_pages=2, **engine), prompts,
                                          max_tokens)
    (tokens, logits), (plain_tokens, plain_logits) = runs["on"], runs["off"]
    assert tokens == plain_tokens and any(len(set(t)) > 1 for t in tokens)
    for row, plain_row in zip(logits, plain_logits):
        assert len(row) == len(plain_row) == max_tokens
        for step, plain_step in zip(row, plain_row):
            np.testing.assert_array_equal(step, plain_step)


def test_traced_layers_give_the_logits_of_the_plain_ones(tiny_loaded, make_engine, monkeypatch):
    # mx.compile replays the same ops and its fused elementwise kernels keep each op's dtype, so every
    # step's logits (rows of different lengths crossing pages on different steps, cascade on) are the
    # plain path's bit for bit.
    import os
    from mlxcel.engine.layer_halves import LayerHalves
    traced = []
    for name in ("traced", "traced_whole"):
        real = getattr(LayerHalves, name)
        monkeypatch.setattr(LayerHalves, name, lambda self, *a, real=real: traced.append(
            os.environ["MLXCEL_TRACED_LAYERS"]) or real(self, *a))
    assert_traced_logits_are_the_plain_ones(make_engine, monkeypatch, 80, (3, 9, 17, 30), 20, block_size=16)
    assert set(traced) == {"on"}      # traced layers ran, and only in the traced run


@pytest.mark.skipif(mx.cuda.is_available(), reason="the portable flat launch (a GPU's fused one is not traced)")
@pytest.mark.parametrize("kv_dtype", [None, "int8", "int4"])
def test_a_traced_flat_step_stores_k_and_v_in_its_layers_traces(tiny_loaded, make_engine, monkeypatch, kv_dtype):
    # Where the ops leave the K/V store to the pool's scatters (MLX's ops, a quantized pool's quantizer), a
    # layer's trace holds them and hands the pool's new arrays back: with cascade off every decode step's layers
    # are traces (the portable flat launch inside), and the logits are the plain path's bit for bit.
    from mlxcel.engine import layer_halves
    stored = []
    real = layer_halves.whole

    def whole(*args):
        out = real(*args)
        stored.append(len(out) == 4)     # the stream's pair and the pool's K and V
        return out

    monkeypatch.setattr(layer_halves, "whole", whole)
    assert_traced_logits_are_the_plain_ones(make_engine, monkeypatch, 40, (3, 11, 20), 10, enabled=False,
                                            block_size=16, kv_dtype=kv_dtype)
    assert stored and all(stored)


@pytest.mark.skipif(mx.cuda.is_available(), reason="the CPU's layer ops (a GPU's rope runs in its q/k/v kernel)")
def test_a_traced_cpu_step_makes_its_rope_tables_once(tiny_loaded, make_engine, monkeypatch, tmp_path):
    # The traced layers take the step's rope tables as inputs (ops.step_rope): made inside a shared trace,
    # every layer's replay would make them again, a cos and a sin a layer.
    import re
    from mlxcel.engine import runner
    monkeypatch.setenv("MLXCEL_TRACED_LAYERS", "on")
    graphs = []
    real = runner.ModelRunner.enqueue

    def enqueue(self, *outputs):
        path = tmp_path / f"step{len(graphs)}.dot"
        mx.export_to_dot(str(path), *outputs)
        graphs.append(path.read_text())
        return real(self, *outputs)

    monkeypatch.setattr(runner.ModelRunner, "enqueue", enqueue)
    engine = make_engine()
    rng = np.random.default_rng()
    engine.generate([random_prompt(rng, n) for n in (20, 30)], SamplingParams(max_tokens=4, ignore_eos=True))
    labels = re.findall(r'label ="(\w+)"', graphs[-1])    # the last step: both rows decoding, traced
    assert len(tiny_loaded.model.layers) > 1 and any(label.startswith("Compiled") for label in labels)
    assert labels.count("Cos") == labels.count("Sin") == 1


def test_layers_alike_share_their_traces_and_a_layer_unlike_them_traces_alone(tiny_model_path, llama_loaded,
                                                                             make_engine, monkeypatch):
    # A shared trace takes each layer's weights as inputs but keeps what is not an input (a norm's eps, the
    # rope) as its template layer has it. The families' layers are alike: one set of traces. A layer whose
    # norm differs gets its own, else it would run the template's eps: the logits stay the plain path's.
    from mlxcel.engine.model import on_pool
    assert len({id(layer.halves.traces) for layer in llama_loaded.model.layers}) == 1
    model, tokenizer = mlx_lm.load(str(tiny_model_path))
    model.layers[1].input_layernorm.eps = 0.25
    loaded = on_pool(model, tokenizer, "unlike", tiny_model_path, "qwen3")
    traces = [layer.halves.traces for layer in model.layers]
    assert traces[1] is not traces[0] and all(t is traces[0] for i, t in enumerate(traces) if i != 1)
    assert_traced_logits_are_the_plain_ones(make_engine, monkeypatch, 48, (3, 11, 20), 12, loaded=loaded)
    assert len(traces[0]) and len(traces[1])


def test_a_traced_layer_takes_its_own_tensor_map(tiny_model_path, make_engine, monkeypatch, on_the_cpu):
    # A Linear's TMA tensor map (gate/up's, on Hopper) is a shared trace's input as its weight is. Ops that
    # fold the MLP's norm and read the map (here a marker per layer added to the activation, the template
    # layer's baked into every layer were it a constant of the trace) give the traced logits the plain path's
    # bit for bit (MLX's composed ops, on the CPU device: a GPU's trace fuses them into kernels that round
    # otherwise).
    from mlxcel.engine import runner
    from mlxcel.kernels.layer_ops import ComposedOps

    loaded = load_model(tiny_model_path)
    layers = loaded.model.model.layers
    for i, layer in enumerate(layers):
        linear = layer.mlp.gate_up_proj
        linear.__dict__["_tensor_map"] = (linear.weight, mx.array([0.05 * (i + 1)], dtype=linear.weight.dtype))
    maps_read = []

    class MapReadingOps(ComposedOps):
        def folds(self, x, weight):   # the composed norms and adds, in the folding order
            return True

        def normed_swiglu(self, x, norm_weight, eps, weight, transposed, tensor_map=None):
            maps_read.append(tensor_map is not None)
            return super().normed_swiglu(x, norm_weight, eps, weight, transposed) + tensor_map[0]

    ops = MapReadingOps()
    monkeypatch.setattr(runner, "layer_ops", lambda: ops)
    assert len({id(layer.halves.traces) for layer in layers}) == 1
    assert_traced_logits_are_the_plain_ones(make_engine, monkeypatch, 48, (3, 11, 20), 12, loaded=loaded)
    assert maps_read and all(maps_read)


def test_quantized_layers_share_their_traces(tiny_model_path, make_engine, monkeypatch):
    # A quantized layer's weights, scales and biases are the shared trace's inputs (its bits and group size
    # settings the trace holds): traced logits are the plain path's bit for bit.
    import mlx.nn as nn
    from mlxcel.engine.model import build_projection_kernels, on_pool
    from mlxcel.kernels.layer_ops import ComposedOps
    model, tokenizer = mlx_lm.load(str(tiny_model_path))
    nn.quantize(model, group_size=64, bits=4, class_predicate=lambda _, m: isinstance(m, nn.Linear))
    loaded = on_pool(model, tokenizer, "quantized", tiny_model_path, "qwen3")
    assert isinstance(model.layers[0].self_attn.qkv_proj, nn.QuantizedLinear)
    assert len({id(layer.halves.traces) for layer in model.layers}) == 1
    assert not build_projection_kernels(model, ComposedOps(), [16])     # MLX's quantized matmuls: none to build
    assert_traced_logits_are_the_plain_ones(make_engine, monkeypatch, 48, (5, 13), 10, loaded=loaded)
    assert len(model.layers[0].halves.traces)


def cascade_runs(tiny_model_path, make_engine, monkeypatch, env: str, values: tuple[str, ...]):
    """(the bf16 model, {value: greedy tokens and logits}, the last engine): 4 rows behind an 80-token shared
    prefix, 24 tokens each, cascade on over pages of 16, once for each value of the env variable ``env``."""
    from mlxcel.engine import cost_model
    monkeypatch.setattr(cost_model, "current", lambda measure: None)   # a GPU's model declines spans this small
    loaded = load_model(tiny_model_path)
    loaded.set_dtype(mx.bfloat16)
    rng = np.random.default_rng()
    system = random_prompt(rng, 80)
    prompts = [system + random_prompt(rng, n) for n in (3, 9, 17, 30)]
    runs = {}
    for value in values:
        monkeypatch.setenv(env, value)
        engine = make_engine(loaded=loaded, enabled=True, min_shared_pages=2, block_size=16)
        runs[value] = engine_greedy_logits(engine, prompts, 24)
    return loaded, runs, engine


def test_whole_layer_traces_give_the_logits_of_the_plain_layers(tiny_model_path, make_engine, monkeypatch):
    # Each decode layer is one trace with the attention's launches inside (the fused cascade on a GPU with
    # 16-bit pages, the CPU's portable flat and composed cascade launches), its layout's arrays as inputs: the
    # logits stay the plain path's bit for bit while rows cross pages on different steps, and a layer is traced
    # once per attention signature (the fused cascade's: row counts), not once per layout.
    from mlxcel import kernels
    from mlxcel.engine import layer_halves
    monkeypatch.setenv("MLXCEL_MATMUL", "cublas")   # the plain path's matmuls in the traces too
    traces, signatures = [], set()
    real = layer_halves.whole

    def whole(layer, ops, attention, *args):
        traces.append(layer)
        signatures.add(attention.signature)
        return real(layer, ops, attention, *args)

    monkeypatch.setattr(layer_halves, "whole", whole)
    loaded, runs, engine = cascade_runs(tiny_model_path, make_engine, monkeypatch, "MLXCEL_TRACED_LAYERS",
                                        ("off", "on"))
    (tokens, logits), (plain_tokens, plain_logits) = runs["on"], runs["off"]
    assert tokens == plain_tokens and any(len(set(t)) > 1 for t in tokens)
    for row, plain_row in zip(logits, plain_logits):
        for step, plain_step in zip(row, plain_row):
            np.testing.assert_array_equal(step, plain_step)
    cascade_steps = engine.metrics.registry.get_sample_value("mlxcel_paged_decode_launches_total",
                                                             {"path": "cascade"}) / loaded.num_layers
    assert cascade_steps >= 20
    fused = kernels.fused_takes(engine.runner.shape)
    if not fused and mx.default_device().type != mx.DeviceType.cpu:
        assert traces == []     # a GPU's portable cascade runs between the traced halves
        return
    # The layers share their traces, made on one template layer: one per signature, and one more for the first
    # layer's calls (no residual stream yet).
    assert 1 <= len(traces) <= 2 * len(signatures)
    assert {id(layer) for layer in traces} == {id(loaded.model.layers[0].halves.traces.template)}
    if fused:
        assert len(traces) <= cascade_steps / 3


def test_folding_the_norms_and_adds_into_the_projections_keeps_the_logits(tiny_loaded, make_engine, monkeypatch):
    # Ops that fold (the CUDA skinny kernel's, here their composed definitions on the CPU) carry the residual
    # stream as one array: each product adds its residual and each projection normalizes the stream itself.
    # The same adds and norms in the same order: every step's logits are the unfolded ones bit for bit.
    from mlxcel.engine import runner
    from mlxcel.kernels.layer_ops import ComposedOps

    class FoldingOps(ComposedOps):
        calls: list[str] = []

        def folds(self, x, weight):
            return True

        def normed_matmul(self, *args):
            self.calls.append("norm")
            return super().normed_matmul(*args)

        def normed_swiglu(self, *args):
            self.calls.append("swiglu")
            return super().normed_swiglu(*args)

        def matmul_add(self, *args):
            self.calls.append("add")
            return super().matmul_add(*args)

        def add_rms_norm(self, *args):
            self.calls.append("add_rms_norm")
            return super().add_rms_norm(*args)

    rng = np.random.default_rng()
    system = random_prompt(rng, 40)
    prompts = [system + random_prompt(rng, n) for n in (3, 11, 20)]
    monkeypatch.setattr(runner, "layer_ops", ComposedOps)     # on a GPU too: the same ops, unfolded
    plain_tokens, plain_logits = engine_greedy_logits(make_engine(enabled=True, min_shared_pages=2), prompts, 12)
    monkeypatch.setattr(runner, "layer_ops", FoldingOps)
    tokens, logits = engine_greedy_logits(make_engine(enabled=True, min_shared_pages=2), prompts, 12)
    assert tokens == plain_tokens and any(len(set(t)) > 1 for t in tokens)
    for row, plain_row in zip(logits, plain_logits):
        for step, plain_step in zip(row, plain_row):
            np.testing.assert_array_equal(step, plain_step)
    layers = tiny_loaded.num_layers
    assert FoldingOps.calls.count("norm") >= layers and FoldingOps.calls.count("swiglu") >= layers
    assert FoldingOps.calls.count("add") >= 2 * layers
    assert "add_rms_norm" not in FoldingOps.calls     # the final norm too: the stream came complete


@pytest.mark.skipif(mx.default_device().type != mx.DeviceType.cpu, reason="the CPU's weight layout")
def test_cpu_weights_are_stored_transposed_and_keep_every_product(tiny_loaded):
    # On the CPU each product's weight is stored as its row-major transpose (BLAS packs that faster), the
    # weight a view of it: the projections, the tied head and the embedding lookups read the same numbers.
    # float32 products against float64: ~K * 2^-24 relative at most, 1e-4 of the output's scale holds it.
    from mlxcel.engine.model import Linear, head_logits

    model = tiny_loaded.model
    linear = model.model.layers[1].mlp.down_proj
    assert isinstance(linear, Linear)
    assert np.asarray(linear.transposed()).flags.c_contiguous and np.asarray(linear.weight).flags.f_contiguous
    table = model.model.embed_tokens.weight
    assert model.args.tie_word_embeddings and np.asarray(table).flags.f_contiguous
    rng = np.random.default_rng()
    x = rng.normal(size=(5, 1, linear.weight.shape[1])).astype(np.float32)
    want = x.astype(np.float64) @ np.asarray(linear.weight, np.float64).T
    np.testing.assert_allclose(np.asarray(linear(mx.array(x))), want, rtol=0, atol=1e-4 * np.abs(want).max())
    hidden = rng.normal(size=(3, table.shape[1])).astype(np.float32)
    want = hidden.astype(np.float64) @ np.asarray(table, np.float64).T
    got = np.asarray(head_logits(model, mx.array(hidden)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    tokens = mx.array([[0], [7], [tiny_loaded.vocab_size - 1]])
    np.testing.assert_array_equal(np.asarray(model.model.embed_tokens(tokens))[:, 0], np.asarray(table)[[0, 7, -1]])


def test_an_engine_builds_each_row_counts_projection_kernels_when_it_starts(tiny_loaded, make_engine, monkeypatch):
    # Ops whose kernels are an instance a row count (CUDA's skinny matmul: per 16 rows) compile them at first
    # launch, seconds each: the engine runs each of a layer's projections once at every such row count up to
    # its batch when it starts, before any step.
    from mlxcel.engine import runner
    from mlxcel.kernels.layer_ops import ComposedOps
    asked, products = [], []

    class InstanceOps(ComposedOps):
        def instance_rows(self, max_rows):
            asked.append(max_rows)
            return [16, 32]

        def matmul(self, x, weight, transposed):
            products.append((x.shape[0], weight.shape))
            return super().matmul(x, weight, transposed)

    monkeypatch.setattr(runner, "layer_ops", InstanceOps)
    engine = make_engine(max_running=24)
    layer = tiny_loaded.model.layers[0]
    weights = {linear.weight.shape for linear in (*layer.self_attn.linears(), layer.self_attn.o_proj,
                                                  *layer.mlp.linears())}
    assert asked == [24] and len(weights) >= 4
    assert sorted(products) == sorted((rows, shape) for rows in (16, 32) for shape in weights)
    # Rank 0 of a tensor-parallel group builds none ahead (a shard's projections hold collectives).
    products.clear()
    runner.ModelRunner(tiny_loaded, engine.pool, ranks=object()).build_kernels(24)
    assert products == []


@pytest.mark.skipif(mx.default_device().type != mx.DeviceType.cpu, reason="the CPU's scatters")
def test_a_cpu_decode_step_stores_k_and_v_in_place_while_the_last_one_runs(make_engine, monkeypatch):
    # MLX's scatter writes in place only into a buffer nothing else holds, and an eval's last task holds every
    # output's buffer until it runs. With the pool in the tokens' eval, the next step's first K/V stores
    # (traced halves: dispatched a few tasks in, while that task waited) copied a layer's pool in about half
    # the steps: MLX's peak memory rose by a layer pool. The pool's own eval is done by then.
    monkeypatch.setenv("MLXCEL_TRACED_LAYERS", "on")
    engine = make_engine(num_blocks=4096)
    layer_bytes = engine.pool.keys[0].nbytes
    rng = np.random.default_rng(7)
    prefix = rng.integers(3, 1000, 256).tolist()
    seqs = [engine.submit(prefix + rng.integers(3, 1000, 8).tolist(), SamplingParams(max_tokens=24, ignore_eos=True))
            for _ in range(8)]
    rises = []
    while True:
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        if not engine.step():
            break
        if min(seq.num_completion_tokens for seq in seqs) >= 2:   # decode-only steps of the whole batch
            rises.append(mx.get_peak_memory() - base)
    assert len(rises) >= 16
    assert max(rises) < layer_bytes / 4, [round(rise / layer_bytes, 2) for rise in rises]


@pytest.mark.skipif(not mx.cuda.is_available(), reason="the q/k/v kernel's store needs a CUDA device (CI has none)")
def test_a_gpu_step_with_a_prefill_chunk_stores_k_and_v_without_copying_a_held_pool(tiny_model_path, make_engine):
    # MLX's scatter writes in place only into a buffer nothing else holds, and the previous step's kernels hold
    # the pool until they finish: a step whose prefill chunk scattered its K/V copied every layer's pool while
    # the last step ran (MLX's peak memory rose by a layer pool). The q/k/v kernel stores them itself, the
    # chunk's gathers ordered after it. A view of every layer's pool held here stands in for the running step.
    loaded = load_model(tiny_model_path)
    loaded.set_dtype(mx.bfloat16)       # a dtype the fused decode kernels take
    engine = make_engine(num_blocks=4096, loaded=loaded)
    layer_bytes = engine.pool.keys[0].nbytes
    rng = np.random.default_rng()
    prefix = random_prompt(rng, 96)
    first = [engine.submit(prefix + random_prompt(rng, 8), SamplingParams(max_tokens=24, ignore_eos=True))
             for _ in range(2)]
    rises, later = [], []
    while True:
        if len(later) < 3 and min(seq.num_completion_tokens for seq in first) >= 2:
            later.append(engine.submit(random_prompt(rng, 40), SamplingParams(max_tokens=4, ignore_eos=True)))
        held = [pool.reshape(pool.shape) for pool in (*engine.pool.keys, *engine.pool.values)]
        mx.eval(held)
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        if not engine.step():
            break
        launched = engine._inflight.batch if engine._inflight is not None else None
        if launched is not None and launched.prefill is not None and launched.decode:   # a chunk beside decode rows
            mx.eval(engine._inflight.launched.tokens)
            rises.append(mx.get_peak_memory() - base)
    assert len(rises) >= 3
    assert max(rises) < layer_bytes / 4, [round(rise / layer_bytes, 2) for rise in rises]
    assert all(seq.num_completion_tokens == seq.params.max_tokens for seq in first + later)


@pytest.mark.skipif(not mx.cuda.is_available(), reason="the skinny matmul needs a CUDA device (CI has none)")
def test_cascade_steps_project_with_the_skinny_kernel_close_to_cublas(tiny_model_path, make_engine, monkeypatch):
    # Steps the fused cascade serves (host-bound) run their projections on the skinny kernel; its sums
    # differ from cuBLAS's in order only, so the logits stay within bfloat16 rounding of each layer's
    # products while the tokens agree (compared up to a row's first differing token: a near-tie may flip).
    from mlxcel.kernels import cuda_matmul
    calls = []
    real = cuda_matmul.skinny_matmul
    monkeypatch.setattr(cuda_matmul, "skinny_matmul", lambda *a, **k: calls.append(k) or real(*a, **k))
    loaded, runs, _ = cascade_runs(tiny_model_path, make_engine, monkeypatch, "MLXCEL_MATMUL", ("cublas", "auto"))
    # Traced: four projections a layer, called as each trace (the layers share it) is made, the norms and adds
    # around them folded in.
    assert len(calls) >= 4
    assert sum(k.get("residual") is not None for k in calls) == len(calls) // 2
    assert sum(bool(k.get("swiglu")) for k in calls) == len(calls) // 4
    (tokens, logits), (plain_tokens, plain_logits) = runs["auto"], runs["cublas"]
    assert any(len(set(t)) > 1 for t in plain_tokens)
    compared = 0
    for row, plain_row, got, want in zip(tokens, plain_tokens, logits, plain_logits):
        agree = next((i for i, (a, b) in enumerate(zip(row, plain_row)) if a != b), len(row))
        for step in range(min(agree + 1, len(row))):   # a step's logits come before its token
            scale = np.abs(want[step]).max()
            assert np.abs(got[step] - want[step]).max() <= 0.05 * scale
            compared += 1
        if agree < len(row):    # where the rows part, cuBLAS's logits had a near-tie: both tokens within tolerance
            scale = np.abs(want[agree]).max()
            assert want[agree][row[agree]] >= want[agree].max() - 0.1 * scale
    assert compared >= len(tokens) * 6


@pytest.mark.parametrize("value, mode", [("off", "off"), ("0", "off"), ("halves", "halves"), ("on", "whole"),
                                         ("whole", "whole"), ("", None)])
def test_the_traced_layers_env_picks_what_is_traced(monkeypatch, value, mode):
    from mlxcel.engine.layer_halves import TracedLayers, traced_layers_wanted
    monkeypatch.setenv("MLXCEL_TRACED_LAYERS", value)
    assert traced_layers_wanted() == TracedLayers(mode or "whole")


def test_a_dtype_change_retraces_the_layers(tiny_model_path, make_engine, monkeypatch):
    # A trace holds the weights it was traced with: after set_dtype the steps must run the new ones.
    monkeypatch.setenv("MLXCEL_TRACED_LAYERS", "on")
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [random_prompt(np.random.default_rng(), 40)]
    loaded = load_model(tiny_model_path)
    make_engine(loaded=loaded).generate(prompts, params)            # traced with the float32 weights
    assert all(len(layer.halves.traces) for layer in loaded.model.layers)
    loaded.set_dtype(mx.bfloat16)
    assert not any(len(layer.halves.traces) for layer in loaded.model.layers)
    traced = make_engine(loaded=loaded).generate(prompts, params)
    monkeypatch.setenv("MLXCEL_TRACED_LAYERS", "off")
    assert traced == make_engine(loaded=loaded).generate(prompts, params)


def test_second_request_hits_the_prefix_cache_and_pages_return(tiny_loaded, make_engine):
    engine = make_engine()
    baseline = engine.pool.num_available
    first, second = shared_prompt_batch(tiny_loaded.tokenizer, 2)
    engine.generate([first], SamplingParams(max_tokens=4))
    engine.generate([second], SamplingParams(max_tokens=4))
    stats = engine.cache.stats()
    assert stats.hits == 1 and stats.prefix_tokens_reused >= 6 * 32
    assert engine.pool.num_live == 0
    assert engine.pool.num_available == baseline
    assert all(c == 0 for c in engine.pool.refcount)


def test_sessions_arriving_together_compute_the_shared_prompt_once(tiny_loaded, make_engine):
    engine = make_engine()
    prompts = shared_prompt_batch(tiny_loaded.tokenizer, 4)
    seqs = [engine.submit(p, SamplingParams(max_tokens=3)) for p in prompts]
    engine.run_until_idle()
    assert engine.cache.stats().hits == 3
    prefill_tokens = sum(r.prefill_tokens for r in engine.snapshot.recent_steps)
    assert prefill_tokens == sum(s.num_prompt_tokens - s.num_reused_tokens for s in seqs)
    # Every later session reuses at least the full pages of the prefix all four share. The fourth
    # may reuse a page more: its question starts with "What" like the first one's, and with a random
    # system prompt a page boundary sometimes falls just after that word (the old expectation,
    # 3 x the smallest reuse, failed then).
    prompt_ids = [s.token_ids[:s.num_prompt_tokens] for s in seqs]
    common = next((i for i, ids in enumerate(zip(*prompt_ids)) if len(set(ids)) > 1), min(map(len, prompt_ids)))
    assert common >= 6 * 32
    assert all(s.num_reused_tokens >= common // 32 * 32 for s in seqs[1:])


def test_small_pool_preempts_and_recomputes_without_changing_tokens(tiny_loaded, make_engine):
    prompts = shared_prompt_batch(tiny_loaded.tokenizer, 4, system_tokens=40)
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    roomy = make_engine(num_blocks=256).generate(prompts, params)
    # Four sequences growing to ~4 pages each, one page shared: 13 pages wanted, 10 there.
    tight = make_engine(num_blocks=10)
    assert tight.generate(prompts, params) == roomy
    assert tight.scheduler.num_preemptions > 0
    assert tight.pool.num_live == 0


def test_request_that_can_never_fit_is_rejected(make_engine):
    engine = make_engine(num_blocks=4)
    with pytest.raises(RequestRejected, match="pool holds 4"):
        engine.submit(list(range(3, 200)), SamplingParams(max_tokens=10))
    assert not engine.scheduler.has_work


@pytest.mark.parametrize("bad, message", [([5, 1 << 20], "token 1 is 1048576, outside the vocabulary"),
                                          ([5, -1], "token 1 is -1"), ([5, 2.0], "token 1 is not an integer"),
                                          ([True, False], "token 0 is not an integer")])
def test_a_prompt_of_bad_token_ids_is_refused_and_the_batch_runs_on(make_engine, bad, message):
    engine = make_engine()
    good = engine.submit(np.arange(10, 40), SamplingParams(max_tokens=4, ignore_eos=True))   # NumPy ints are ints
    with pytest.raises(ValueError, match=message):
        engine.submit(bad, SamplingParams(max_tokens=4))
    engine.run_until_idle()
    assert good.finish_reason == "length" and len(good.completion_token_ids) == 4
    assert all(type(t) is int for t in good.token_ids)
    assert engine.pool.num_live == 0


def test_cancel_releases_pages(tiny_loaded, make_engine):
    engine = make_engine()
    prompts = shared_prompt_batch(tiny_loaded.tokenizer, 2, system_tokens=40)
    a = engine.submit(prompts[0], SamplingParams(max_tokens=50, ignore_eos=True))
    b = engine.submit(prompts[1], SamplingParams(max_tokens=5, ignore_eos=True))
    for _ in range(4):
        engine.step()
    engine.cancel(a)
    engine.run_until_idle()
    assert a.finish_reason == "cancelled" and b.finish_reason == "length"
    assert engine.pool.num_live == 0


def test_unsupported_architecture_is_a_clear_error(tmp_path, tiny_model_path):
    for name in ("config.json",):
        (tmp_path / name).write_text(json.dumps({"model_type": "gemma3"}))
    with pytest.raises(ModelLoadError, match="model type 'gemma3' is not supported"):
        load_model(tmp_path)
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="malformed"):
        load_model(tmp_path)
