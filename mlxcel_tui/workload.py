"""An engine and its built-in sessions from a command's choices: the model
(a directory or a built-in one, converted on first use), the cascade
settings, the pool, the shared system prompt."""

from __future__ import annotations

import resource
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
                 max_batched_tokens: int | None = None):
    """The engine on MODEL: a model directory, or a built-in name (None: the
    default). ``progress(what, done, total)`` follows a first-use conversion,
    ``stage(what)`` the steps after it."""
    import_mlx_lm()  # before any engine module imports it
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    config = CascadeConfig.from_env()
    config.update(**{k: v for k, v in (("enabled", cascade), ("min_shared_pages", min_shared_pages),
                                       ("min_members", min_members)) if v is not None})
    loaded = load_served_model(model, None if dtype == "auto" else dtype, progress, stage or (lambda what: None))
    engine_config = EngineConfig(block_size=block_size, num_blocks=kv_blocks)
    if max_batched_tokens:
        engine_config.max_batched_tokens = max_batched_tokens
    if kv_cache_mb:
        engine_config.pool_bytes = kv_cache_mb * 2**20
    engine = Engine(loaded, engine_config, cascade=config)
    engine.process_facts[EXTRA_BLAS] = blas.describe()
    return engine


def served_model(model: str | None) -> tuple[str | None, str | None]:
    """(model, notice): MODEL as given, or the built-in model to use instead of
    none, with a notice when it is not the default."""
    from mlxcel.engine.builtin_models import DEFAULT, TINY, available

    if model not in (None, DEFAULT, TINY):
        return model, None
    return available(model or DEFAULT)


def load_served_model(model: str | None, dtype: str | None, progress, stage):
    from mlxcel.engine.builtin_models import DEFAULT, TINY, builtin_model
    from mlxcel.engine.gguf import GGUFError
    from mlxcel.engine.model import ModelLoadError, load_model
    from mlxcel.engine.model_cache import ModelCacheError

    try:
        if model in (None, DEFAULT, TINY):
            stage("checking the model cache")
            path, name = builtin_model(model or DEFAULT, dtype, progress=progress)
            stage(f"loading {name}")
            return load_model(path, name)
        stage(f"loading {model}")
        loaded = load_model(model)
    except (ModelLoadError, ModelCacheError, GGUFError) as err:
        raise CliError(str(err)) from err
    if dtype:
        import mlx.core as mx

        loaded.set_dtype(getattr(mx, dtype))  # float parameters only; quantized weights stay as they are
    return loaded


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


def start_sessions(engine, count: int, system_prompt: str, max_tokens: int, turns: int | None = None):
    from mlxcel.engine.sessions import SessionManager
    from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS

    manager = SessionManager(engine, system_prompt, list(DEFAULT_QUESTIONS), max_tokens=max_tokens, turns=turns)
    manager.add(count)
    return manager
