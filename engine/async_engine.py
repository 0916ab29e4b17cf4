"""A thin typed layer over vLLM's AsyncLLM with LoRA enabled."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from vllm import AsyncEngineArgs, SamplingParams
from vllm.config import StructuredOutputsConfig
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import exceptions as vllm_exceptions
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerBase

from adapters.home import data_home
from adapters.identity import AdapterIdentity, LocatedAdapter
from engine.adapter_ids import AdapterIds, engine_lora_name
from engine.config import EngineConfig
from engine.dtype import cpu_flags, resolve_dtype
from engine.types import (
    ChoiceDelta,
    EngineDeadError,
    EngineError,
    EngineLoad,
    EngineRequestError,
    PositionLogprobs,
    TokenLogprob,
)
from engine.worker import malloc_trim

logger = logging.getLogger(__name__)

# oneDNN's process-wide primitive cache holds 1024 primitives by default, and a matmul primitive keeps buffers sized
# by its row count (about M x N x 4 bytes): as rarer, larger batches came, the worker's RSS grew for hours
# (docs/reliability.md). vLLM's linear layers keep their own primitives per layer; 64 bounds the rest (54 MiB of
# growth against 362 in scripts/bench_onednn_cache.py) and keeps torch's bfloat16 bmm, which has no cache of its
# own, near the default's speed (99 against 87 us a call), where 0 made it 6.5x slower.
ONEDNN_PRIMITIVE_CACHE = 64


def model_id_of(config: EngineConfig) -> str:
    """The served id: explicit name, else the id the demo builder recorded, else the folder name."""
    if config.served_model_name:
        return config.served_model_name
    marker = Path(config.model) / "loraplex_model.json"
    if marker.is_file():
        return json.loads(marker.read_text())["model_id"]
    return Path(config.model).name


StepListener = Callable[[float, int, bool], None]  # (wall time of the step, tokens in it, engine busy)


def _load_logger_factory(load: EngineLoad, step_listeners: list[StepListener]):
    class _LoadLogger(StatLoggerBase):
        """Keeps the engine core's latest scheduler snapshot, and tells listeners of each engine step."""

        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                load.running = scheduler_stats.num_running_reqs
                # Deferred: waiting for their adapter to get a slot, which vLLM counts apart.
                load.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                load.kv_cache_usage = scheduler_stats.kv_cache_usage
                load.running_by_adapter = dict(scheduler_stats.running_lora_adapters)
                load.steps += 1
            if iteration_stats is not None:
                load.generation_tokens += iteration_stats.num_generation_tokens
                tokens = iteration_stats.num_generation_tokens + iteration_stats.num_prompt_tokens
                busy = scheduler_stats is None or scheduler_stats.num_running_reqs > 0 or tokens > 0
                for listener in step_listeners:
                    listener(iteration_stats.iteration_timestamp, tokens, busy)

        def log_engine_initialized(self):
            pass

    return _LoadLogger


class _UnexposedPrometheus(PrometheusStatLogger):
    """Stands in for vLLM's Prometheus logger, which vLLM adds unless one is given. Its metrics go to
    prometheus_client's global registry, which loraplex never serves (its /metrics has its own registry), so
    recording them (a histogram observation per output token, several per finished request) was CPU the API
    process spent for nobody."""

    def __init__(self, vllm_config, engine_indexes=None):
        pass

    def record(self, *args, **kwargs):
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass

    def record_sleep_state(self, sleep: int = 0, level: int = 0):
        pass

    def log_engine_initialized(self):
        pass

    def log(self):
        pass


def _position(token_id: int, candidates: dict, tokenizer, num_top: int) -> PositionLogprobs:
    """vLLM gives, per position, the chosen token plus the `num_top` best, each with its rank."""
    def entry(tid: int, lp) -> TokenLogprob:
        text = lp.decoded_token if lp.decoded_token is not None else tokenizer.decode([tid])
        return TokenLogprob(token_id=tid, token=text, logprob=float(lp.logprob))

    ranked = sorted(candidates.items(), key=lambda item: item[1].rank or 0)
    return PositionLogprobs(chosen=entry(token_id, candidates[token_id]),
                            top=tuple(entry(tid, lp) for tid, lp in ranked[:num_top]))


def _logprobs_of(output, tokenizer, num_top: int) -> tuple[PositionLogprobs, ...] | None:
    if output.logprobs is None:
        return None
    return tuple(_position(t, c, tokenizer, num_top) for t, c in zip(output.token_ids, output.logprobs))


def _prompt_logprobs_of(out, prompt_token_ids: list[int], tokenizer,
                        num_top: int) -> tuple[PositionLogprobs | None, ...] | None:
    if out.prompt_logprobs is None:
        return None
    return tuple(None if candidates is None else _position(t, candidates, tokenizer, num_top)
                 for t, candidates in zip(prompt_token_ids, out.prompt_logprobs))


def _prompt(prompt_token_ids: list[int], cache_salt: str | None) -> TokensPrompt:
    if cache_salt is None:
        return TokensPrompt(prompt_token_ids=prompt_token_ids)
    return TokensPrompt(prompt_token_ids=prompt_token_ids, cache_salt=cache_salt)


class _Waiting:
    """Counts a request in `by_adapter` from its submission to its first output. vLLM's own per-adapter waiting
    count only learns that a request was queued from its first output, so it never shows a request waiting."""

    def __init__(self, by_adapter: dict[str, int], adapter: str | None):
        self._by_adapter, self._adapter = by_adapter, adapter
        if adapter is not None:
            by_adapter[adapter] = by_adapter.get(adapter, 0) + 1

    def over(self) -> None:
        if self._adapter is not None:
            self._by_adapter[self._adapter] -= 1
            if not self._by_adapter[self._adapter]:
                del self._by_adapter[self._adapter]
            self._adapter = None


class LoraplexEngine:
    """Owns one AsyncLLM. Adapters are passed per request as LoRARequests keyed by name and content hash."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_id = model_id_of(config)
        self.max_model_len = config.max_model_len
        self._ids = AdapterIds()
        self._load = EngineLoad()
        self._step_listeners: list[StepListener] = []
        self._llm: AsyncLLM | None = None

    def start(self) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(self.config.kv_cache_gib))))
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVE_CACHE))  # read by the workers
        malloc_trim.period_s(os.environ)  # read by the workers: a bad value fails here, by name
        # The compiled graph's caches (vLLM's and inductor's), kept with the rest of loraplex's data: a restart
        # with the same model and settings reuses the generated code.
        os.environ.setdefault("VLLM_CACHE_ROOT", str(data_home() / "compile-cache" / "vllm"))
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(data_home() / "compile-cache" / "inductor"))
        args = AsyncEngineArgs(
            model=self.config.model,
            served_model_name=self.model_id,
            dtype=resolve_dtype(self.config.dtype, on_cpu=current_platform.is_cpu(), flags=cpu_flags()),
            max_model_len=self.config.max_model_len,
            max_num_seqs=self.config.max_num_seqs,
            enable_lora=True,
            max_loras=self.config.max_loras,
            max_cpu_loras=self.config.max_cpu_loras,
            max_lora_rank=self.config.max_lora_rank,
            kv_cache_memory_bytes=int(self.config.kv_cache_gib * 2**30),
            seed=self.config.seed,
            disable_log_stats=False,
            # The serving layer checks constraints with xgrammar before the engine sees them (api/openai/structured.py).
            # No free whitespace in JSON: a model that pads with it could spend its whole budget there.
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        )
        started = time.monotonic()
        logger.info("starting vLLM engine for %s (20-40 s on CPU; a model's first compile adds 30-80 s)", self.model_id)
        loggers = [_load_logger_factory(self._load, self._step_listeners), _UnexposedPrometheus]
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
        compilation = self._llm.vllm_config.compilation_config
        logger.info("engine ready in %.1f s (%s, compilation mode %s, backend %s)", time.monotonic() - started,
                    self._llm.vllm_config.model_config.dtype, compilation.mode.name, compilation.backend or "-")

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise EngineDeadError("engine not started")
        return self._llm

    def tokenizer(self):
        return self.llm.get_tokenizer()

    def add_step_listener(self, listener: StepListener) -> None:
        """`listener(wall_time, tokens, busy)` runs on the event loop after every engine step."""
        self._step_listeners.append(listener)

    def adapter_id(self, identity: AdapterIdentity) -> int:
        return self._ids.id_for(identity)

    def engine_name(self, identity: AdapterIdentity) -> str:
        return engine_lora_name(identity)

    async def load_adapter(self, adapter: LocatedAdapter) -> None:
        """Loads the adapter into the engine's CPU cache (and a slot); the engine core does the reading."""
        try:
            await self.llm.add_lora(self.lora_request(adapter))
        except vllm_exceptions.EngineDeadError as e:
            raise EngineDeadError("the engine process died") from e
        except Exception as e:
            raise EngineError(f"the engine could not load adapter {adapter.identity.label}: {e}") from e

    async def unload_adapter(self, adapter_id: int) -> None:
        await self.llm.remove_lora(adapter_id)

    async def resident_adapter_ids(self) -> set[int]:
        """Ids in the engine's CPU cache, as the engine core reports them."""
        return set(await self.llm.list_loras())

    def lora_request(self, adapter: LocatedAdapter) -> LoRARequest:
        return LoRARequest(
            lora_name=engine_lora_name(adapter.identity),
            lora_int_id=self._ids.id_for(adapter.identity),
            lora_path=str(adapter.path),
        )

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter: LocatedAdapter | None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[list[ChoiceDelta]]:
        """Yields, per engine step, the new output of each choice that advanced. Requests with different
        `cache_salt`s never share prefix-cache blocks."""
        params.output_kind = RequestOutputKind.DELTA
        lora = self.lora_request(adapter) if adapter is not None else None
        tokenizer = self.tokenizer()
        waiting = _Waiting(self._load.waiting_by_adapter, lora.lora_name if lora is not None else None)
        try:
            async for out in self.llm.generate(
                _prompt(prompt_token_ids, cache_salt), params, request_id, lora_request=lora
            ):
                waiting.over()
                prompt_logprobs = _prompt_logprobs_of(out, prompt_token_ids, tokenizer, params.prompt_logprobs or 0)
                yield [
                    ChoiceDelta(
                        index=o.index,
                        text=o.text,
                        token_ids=tuple(o.token_ids),
                        logprobs=_logprobs_of(o, tokenizer, params.logprobs or 0),
                        finish_reason=o.finish_reason,
                        cached_prompt_tokens=out.num_cached_tokens or 0,
                        prompt_logprobs=prompt_logprobs,
                    )
                    for o in out.outputs
                ]
        except vllm_exceptions.EngineDeadError as e:
            raise EngineDeadError("the engine process died") from e
        except vllm_exceptions.EngineGenerateError as e:
            raise EngineError(f"engine failed on request {request_id}") from e
        except (ValueError, VLLMClientError) as e:  # vLLM refused the request as invalid
            raise EngineRequestError(str(e)) from e
        finally:
            waiting.over()

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    def is_alive(self) -> bool:
        return self._llm is not None and not self._llm.errored

    def load(self) -> EngineLoad:
        return self._load

    def num_unfinished_requests(self) -> int:
        return self._llm.get_num_unfinished_requests() if self._llm is not None else 0

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
