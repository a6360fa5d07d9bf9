"""An engine and its built-in sessions from a command's choices: the model
(a directory or a built-in one, converted on first use), the cascade
settings, the pool, the shared system prompt."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

from mlxcel.engine import blas
from .frame import EXTRA_BLAS
from .options import CliError


def import_mlx_lm() -> None:
    """Import mlx-lm keeping this process's file limit: its import sets
    RLIMIT_NOFILE to (2048, 4096), which lowers a higher limit for good and
    fails ("not allowed to raise maximum limit") where the hard limit is lower."""
    setrlimit = resource.setrlimit
    resource.setrlimit = lambda which, limits: None if which == resource.RLIMIT_NOFILE else setrlimit(which, limits)
    try:
        import mlx_lm  # noqa: F401
    finally:
        resource.setrlimit = setrlimit


def build_engine(model: str | None, cascade: bool | None, min_shared_pages: int | None,
                 min_members: int | None, kv_blocks: int | None = None, kv_cache_mb: int | None = None,
                 block_size: int = 32, dtype: str = "auto", progress=None, stage=None,
                 max_batched_tokens: int | None = None, ranks=None, kv_dtype: str = "auto"):
    """The engine on MODEL: a model directory, or a built-in name (None: the
    default). ``progress(what, done, total)`` follows a first-use conversion,
    ``stage(what)`` the steps after it. With ``ranks`` (rank 0 of several),
    on this rank's shard of the model. A pool the model cannot have (a KV
    format its head dim does not fit, say) is one CliError, before the engine
    starts anything; under tensor parallelism, the other ranks are told the
    start is off and end quietly (Ranks.call_off)."""
    import_mlx_lm()  # before any engine module imports it
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    config = CascadeConfig.from_env()
    config.update(**{k: v for k, v in (("enabled", cascade), ("min_shared_pages", min_shared_pages),
                                       ("min_members", min_members)) if v is not None})
    engine_config = EngineConfig(block_size=block_size, num_blocks=kv_blocks,
                                 kv_dtype=None if kv_dtype == "auto" else kv_dtype)
    if max_batched_tokens:
        engine_config.max_batched_tokens = max_batched_tokens
    if kv_cache_mb:
        engine_config.pool_bytes = kv_cache_mb * 2**20
    weights_dtype = None if dtype == "auto" else dtype
    stage = stage or (lambda what: None)
    path, name = model_path(model, weights_dtype, progress, stage)
    widen_graph_bound(path, engine_config, weights_dtype)
    loaded = load_model_at(path, name, model, weights_dtype, stage, ranks)
    try:
        engine = Engine(loaded, engine_config, cascade=config, ranks=ranks)
    except ValueError as err:   # the pool's refusal: PoolGeometry.named, BlockPool
        raise CliError(str(err)) from err
    engine.process_facts[EXTRA_BLAS] = blas.describe()
    return engine


def served_model(model: str | None) -> tuple[str | None, str | None]:
    """(model, notice): MODEL as given, or the built-in model to use instead of
    none, with a notice when it is not the default."""
    from mlxcel.engine.builtin_models import DEFAULT, TINY, available

    if model not in (None, DEFAULT, TINY):
        return model, None
    return available(model or DEFAULT)


def model_path(model: str | None, dtype: str | None, progress=None, stage=None) -> tuple[Path, str | None]:
    """(directory, name) of MODEL: a built-in one converted on first use; the name None for a directory."""
    from mlxcel.engine.builtin_models import DEFAULT, TINY, builtin_model
    from mlxcel.engine.gguf import GGUFError
    from mlxcel.engine.model_cache import ModelCacheError

    if model not in (None, DEFAULT, TINY):
        return Path(model), None
    if stage:
        stage("checking the model cache")
    try:
        return builtin_model(model or DEFAULT, dtype, progress=progress)
    except (ModelCacheError, GGUFError) as err:
        raise CliError(str(err)) from err


def check_ranks(model: str | None, dtype: str, ranks: int, progress=None) -> None:
    """Refuse before anything starts a model that cannot be split over ``ranks`` ranks."""
    from mlxcel.engine.model import ModelLoadError, check_shardable

    path, name = model_path(model, None if dtype == "auto" else dtype, progress)
    try:
        check_shardable(path.expanduser().resolve(), ranks, name)
    except ModelLoadError as err:
        raise CliError(str(err)) from err


def widen_graph_bound(path: Path, engine_config, dtype: str | None) -> None:
    """MLX's CUDA graph byte bound for the pool the engine will make on the model at ``path``
    (graph_bound), set before the model loads. A config the pool's sizing cannot read is
    left to the load and the engine, which say what is wrong."""
    from mlxcel.engine import graph_bound
    from mlxcel.engine.model import ModelLoadError, config_pool_geometry

    try:
        geometry = config_pool_geometry(path, engine_config.block_size, engine_config.kv_dtype or dtype)
    except (ModelLoadError, ValueError, KeyError, OSError):
        return
    graph_bound.widen_for_pool(geometry, engine_config.pool_blocks(geometry))


def load_served_model(model: str | None, dtype: str | None, progress, stage, ranks=None):
    path, name = model_path(model, dtype, progress, stage)
    return load_model_at(path, name, model, dtype, stage, ranks)


def load_model_at(path: Path, name: str | None, model: str | None, dtype: str | None, stage, ranks=None):
    """The model at ``path`` (``name``: a built-in one's, None for a directory given as ``model``)."""
    from mlxcel.engine.model import ModelLoadError, load_model

    group = ranks.group if ranks is not None else None
    try:
        stage(f"loading {name or model}" + (f" (rank {ranks.rank} of {ranks.size})" if ranks else ""))
        loaded = load_model(path, name, group)
    except ModelLoadError as err:
        raise CliError(str(err)) from err
    if name is not None:
        return loaded
    if dtype:
        import mlx.core as mx

        loaded.set_dtype(getattr(mx, dtype))  # float parameters only; quantized weights stay as they are
    return loaded


def join_ranks(tensor_parallel: int | None, backend: str | None):
    """This process's ranks, when mlx.launch started it as one of them (else None)."""
    from mlxcel.engine.tensor_parallel import RankError, Ranks, launched

    if not launched():
        return None
    try:
        ranks = Ranks.join(backend)
    except RankError as err:
        raise CliError(str(err)) from err
    if tensor_parallel is not None and tensor_parallel != ranks.size:
        raise CliError(f"--tensor-parallel {tensor_parallel} under a launch of {ranks.size} ranks")
    if not ranks.is_leader:   # they stop when rank 0 says so (or is gone), not on a Ctrl-C of their own
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return ranks


def follow_as_rank(model: str | None, dtype: str, ranks) -> None:
    """A rank other than 0: load this rank's shard, size the pool as rank 0
    says, and run rank 0's steps until it stops."""
    import_mlx_lm()
    from mlxcel.engine.pool import BlockPool, PoolGeometry
    from mlxcel.engine.runner import ModelRunner
    from mlxcel.engine.tensor_parallel import follow, model_facts

    loaded = load_served_model(model, None if dtype == "auto" else dtype, None, lambda what: None, ranks)
    facts = ranks.share_pool(model_facts(loaded), None)
    if facts is None:   # rank 0 refused its pool and says why
        return
    geometry = PoolGeometry.named(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, facts.block_size,
                                  facts.dtype)
    follow(ModelRunner(loaded, BlockPool(geometry, facts.num_blocks), ranks), ranks)


def system_prompt_text(engine, system_prompt: Path | None, shared_prefix_tokens: int | None) -> str:
    from mlxcel.engine.sessions import synthetic_system_prompt
    from mlxcel.engine.session_prompts import DEFAULT_SYSTEM_PROMPT

    if system_prompt:
        try:
            return system_prompt.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise CliError(f"cannot read --system-prompt {system_prompt}: {err}") from err
    if shared_prefix_tokens:
        return synthetic_system_prompt(engine.tokenizer, shared_prefix_tokens, DEFAULT_SYSTEM_PROMPT)
    return DEFAULT_SYSTEM_PROMPT


def start_sessions(engine, count: int, system_prompt: str | list[str], max_tokens: int, turns: int | None = None):
    """``count`` sessions; several system prompts (tenants) take the sessions in turn."""
    from mlxcel.engine.sessions import SessionManager
    from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS

    manager = SessionManager(engine, system_prompt, list(DEFAULT_QUESTIONS), max_tokens=max_tokens, turns=turns)
    manager.add(count)
    return manager
