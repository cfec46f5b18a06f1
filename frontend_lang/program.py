"""``@function`` programs, ``run`` and ``run_batch``, and the default backend."""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tqdm import tqdm

from frontend_lang.backend.base import Backend
from frontend_lang.prefix_trace import is_recording
from frontend_lang.state import Program, ProgramError, ProgramState

logger = logging.getLogger(__name__)

_default_backend: Backend | None = None


def set_default_backend(backend: Any) -> None:
    """The backend programs use when ``run`` is given none: a ``RuntimeEndpoint``, an
    ``EngineBackend``, a ``Runtime`` (its endpoint), or a ``runtime.Engine`` (wrapped in an
    ``EngineBackend``)."""
    global _default_backend
    _default_backend = _as_backend(backend)


def get_default_backend() -> Backend | None:
    return _default_backend


_WRAP_LOCK = threading.Lock()


def _as_backend(backend: Any) -> Backend:
    if isinstance(backend, Backend):
        return backend
    if isinstance(getattr(backend, "endpoint", None), Backend):  # sgl.Runtime, as SGLang takes it
        return backend.endpoint
    from runtime.engine import Engine

    if isinstance(backend, Engine):
        from frontend_lang.backend.engine import EngineBackend

        # One backend per engine, however often (and from however many threads: run_batch)
        # it is passed (backends on one engine share it anyway).
        with _WRAP_LOCK:
            wrapped = getattr(backend, "_dsl_backend", None)
            if wrapped is None or wrapped.is_stopped:
                wrapped = backend._dsl_backend = EngineBackend(backend)  # type: ignore[attr-defined]
        return wrapped
    raise TypeError(f"not a backend: {type(backend).__name__}; use RuntimeEndpoint(url) or EngineBackend()")


def _run_defaults(
    max_new_tokens: int = 128,
    n: int = 1,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float = 0.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    ignore_eos: bool = False,
    return_logprob: bool = False,
    logprob_start_len: int = -1,
    top_logprobs_num: int = 0,
    return_text_in_logprobs: bool = False,
) -> dict[str, Any]:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"run(): n must be a positive integer, got {n!r}")
    return {
        "sampling": {
            "max_new_tokens": max_new_tokens,
            "n": n,
            "stop": stop,
            "stop_token_ids": stop_token_ids,
            "stop_regex": stop_regex,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "frequency_penalty": frequency_penalty,
            "presence_penalty": presence_penalty,
            "ignore_eos": ignore_eos,
        },
        "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text_in_logprobs,
    }


_SAMPLING_DEFAULTS = frozenset(inspect.signature(_run_defaults).parameters)


class SglFunction:
    """A program: a Python function whose first parameter is the state ``s``."""

    def __init__(self, func: Callable[..., Any], bind_arguments: dict[str, Any] | None = None) -> None:
        self.func = func
        functools.update_wrapper(self, func)
        every = list(inspect.signature(func).parameters.values())[1:]
        params = [p for p in every if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.arg_names = [p.name for p in params]  # SGLang's: the program's own positional parameters
        self._named = {p.name for p in every if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self.arg_defaults = [p.default for p in params if p.default is not inspect.Parameter.empty]
        self.bind_arguments = dict(bind_arguments or {})

    def bind(self, **kwargs: Any) -> SglFunction:
        """The program with some arguments fixed (as SGLang's): ``qa.bind(style="brief").run(question=q)``."""
        unknown = [k for k in kwargs if k not in self._named]
        if unknown:
            raise TypeError(f"{self.__name__}.bind(): the program has no parameter {', '.join(map(repr, unknown))}")
        return SglFunction(self.func, {**self.bind_arguments, **kwargs})

    def cache(self, backend: Any = None) -> str:
        """Prefill the program's fixed opening (text and roles before anything that depends
        on its arguments or the model) once, so that its first runs find it cached; SGLang's
        ``cache``. Returns the text prefilled ("" when it is 64 characters or fewer)."""
        from frontend_lang.prefix_trace import cache_program

        return cache_program(self, _backend_or_default(backend))

    def trace(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError("SglFunction.trace() (SGLang's program graphs) is not supported here; "
                                  "cache() prefills a program's fixed opening")

    def compile(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError("SglFunction.compile() (SGLang's compiled program graphs) is not supported here")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and (isinstance(args[0], ProgramState) or is_recording(args[0])):  # inside another program
            return self.func(*args, **{**kwargs, **self.bind_arguments})
        return self.run(*args, **kwargs)

    def run(
        self,
        *args: Any,
        backend: Any = None,
        stream: bool = False,
        pin_cache: bool = True,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program; returns its state (``s.text()``, ``s["var"]``, ``s.ret_value``).
        Sampling defaults (``max_new_tokens=128``, ``temperature=1.0``, ``stop``, ...) apply
        to every ``gen`` that does not set them. ``pin_cache`` keeps the program's prefixes
        in the server's cache while it runs. With ``stream=True`` the program runs in the
        background; read it with ``s.text_iter()``. As in SGLang, an operation that fails
        (a ``gen`` the server refuses) ends the program without raising: ``s.error()`` holds
        the ``ProgramError`` (also logged), ``s.text()`` the text so far. An exception of the
        program's own Python code is raised. ``use_thread`` is taken for SGLang's sake and
        changes nothing: the program's operations always run on a thread of their own.
        Ctrl-C (``KeyboardInterrupt``) stops it at once: nothing more is sent (``Program.interrupt``)."""
        return self._run(args, kwargs, backend, stream, pin_cache, None)

    def run_in_batch(self, batch: ProgramBatch, *args: Any, backend: Any = None, **kwargs: Any) -> ProgramState:
        """``run`` as one program of ``batch``: ``batch.interrupt()`` stops it with the others
        (for callers that run programs on their own threads, as ``run_batch`` does)."""
        return self._run(args, kwargs, backend, False, True, batch)

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any], backend: Any, stream: bool, pin_cache: bool,
             batch: ProgramBatch | None, sampling: dict[str, Any] | None = None,
             keep_own_error: bool = False) -> ProgramState:
        """``sampling``: the run's sampling defaults, with every key of ``kwargs`` the program's
        (``run_batch``); None takes those among ``kwargs`` that name one (``run``, as SGLang's).
        An exception of the program's own code is raised, or with ``keep_own_error``
        (``run_batch``) kept in the state beside what the program made until then."""
        kwargs = {**kwargs, **self.bind_arguments}  # bound arguments win, as in SGLang
        if sampling is None:
            sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in _SAMPLING_DEFAULTS}
        chosen = _backend_or_default(backend)
        program = Program(chosen, _run_defaults(**sampling), pin_cache, stream)
        if batch is not None:
            batch.add(program)
        state = ProgramState(program)
        own_error: list[BaseException] = []

        def body() -> None:
            try:
                state.ret_value = self.func(state, *args, **kwargs)
                program.sync_all()
            except ProgramError as err:  # an operation failed (read back inside the body); logged then
                state._error = state._error or err  # noqa: SLF001
            except Exception as err:  # the program's own code failed: what it queued still runs
                own_error.append(err)
            except BaseException:  # Ctrl-C in the program's code or while it waited: stop sending
                program.interrupt()
                raise
            finally:
                program.sync_all()
                if own_error:
                    state._error = own_error[0]  # noqa: SLF001
                    if stream:  # no caller to raise it to
                        logger.error("program %s raised", self.__name__, exc_info=own_error[0])
                try:
                    program.end()
                except Exception as err:  # the pins expire under pressure anyway; say so
                    logger.warning("could not release the cache pins of %s: %s", self.__name__, err)
                finally:
                    for st in list(program.states):
                        st.mark_finished()

        if stream:
            program.body_thread = threading.Thread(target=body, daemon=True, name=f"program-{self.__name__}")
            program.body_thread.start()
            return state
        body()
        if own_error and not keep_own_error:
            raise own_error[0]
        return state

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]] | list[tuple[Any, ...]] | list[list[Any]],
        *,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        backend: Any = None,
        generator_style: bool = False,
        **defaults: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per kwargs dict (or tuple / list of its arguments in order, as
        SGLang takes them), ``num_threads`` at a time (``auto``: all of them up to 256, so their
        requests batch together). A program that fails does not stop the others: its state's
        ``error()`` says why. ``generator_style``: the states are yielded, in order, as each
        is done (SGLang's option). The keywords are the runs' sampling defaults (``run``'s);
        every key of a ``batch_kwargs`` dict is the program's argument, whatever its name."""
        if isinstance(batch_kwargs, (dict, str, bytes)) or not isinstance(batch_kwargs, Iterable):
            raise TypeError("run_batch takes a list of argument dicts (or of tuples / lists of "
                            f"arguments in order), got a {type(batch_kwargs).__name__}")
        batch_kwargs = list(batch_kwargs)  # a generator too
        pin_cache = defaults.pop("pin_cache", True)
        for unused in ("use_thread", "stream"):  # run()'s: taken, and unused in a batch
            defaults.pop(unused, None)
        unknown = sorted(set(defaults) - _SAMPLING_DEFAULTS)
        if unknown:
            raise TypeError(f"run_batch() got unexpected keyword argument(s) {', '.join(unknown)}: "
                            "the programs' arguments go in batch_kwargs")
        _run_defaults(**defaults)  # a bad value fails here, not once per program
        _backend_or_default(backend)  # as run(): no backend is an error, not one per state
        if num_threads == "auto":
            workers = max(1, min(len(batch_kwargs), 256))
        elif isinstance(num_threads, int) and num_threads >= 1:
            workers = num_threads
        else:
            raise ValueError(f"num_threads must be 'auto' or a positive integer, got {num_threads!r}")

        # With bound arguments a list is mapped to the parameters' names (SGLang's rule: a
        # bound one's place is taken); a wrong count then fails here, before any runs.
        given = [self._by_name(args) for args in batch_kwargs] if self.bind_arguments else list(batch_kwargs)

        batch = ProgramBatch()

        def one(args: dict[str, Any] | tuple[Any, ...] | list[Any]) -> ProgramState:
            try:
                if isinstance(args, (tuple, list)):
                    return self._run(tuple(args), {}, backend, False, pin_cache, batch, defaults, keep_own_error=True)
                return self._run((), dict(args), backend, False, pin_cache, batch, defaults, keep_own_error=True)
            except Exception as err:  # before it ran (its arguments): kept in a state of its own
                return _failed_state(err, backend)

        pool = concurrent.futures.ThreadPoolExecutor(workers)
        futures = [pool.submit(one, kw) for kw in given]
        if generator_style:
            return _in_order(futures, pool, batch, self.__name__, progress_bar)
        try:
            with tqdm(total=len(futures), desc=self.__name__, disable=not progress_bar) as bar:
                for f in concurrent.futures.as_completed(futures):
                    bar.update(1)
                    del f
        except BaseException:  # Ctrl-C: the programs running stop sending; the others never start
            batch.interrupt()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return [f.result() for f in futures]

    def _by_name(self, args: dict[str, Any] | tuple[Any, ...] | list[Any]) -> dict[str, Any]:
        """A run's arguments by name; a tuple or list gives the positional parameters in order
        (SGLang's rule, so a bound parameter's place is taken and its bound value used)."""
        if not isinstance(args, (tuple, list)):
            return args
        if not len(self.arg_names) - len(self.arg_defaults) <= len(args) <= len(self.arg_names):
            raise TypeError(f"{self.__name__}: got {len(args)} arguments for parameters {', '.join(self.arg_names)}")
        return dict(zip(self.arg_names, args, strict=False))


class ProgramBatch:
    """The programs of one ``run_batch`` (or of a caller's own pool: ``run_in_batch``), so
    that Ctrl-C stops all of them (``interrupt``)."""

    def __init__(self) -> None:
        self.programs: list[Program] = []
        self.lock = threading.Lock()
        self.interrupted = threading.Event()  # callers that wait before a program may wait on it

    def add(self, program: Program) -> None:
        with self.lock:
            self.programs.append(program)
            if self.interrupted.is_set():  # started as the batch was being stopped
                program.interrupt()

    def interrupt(self) -> None:
        with self.lock:
            self.interrupted.set()
            programs = list(self.programs)
        for p in programs:
            p.interrupt()


def _in_order(futures: list[concurrent.futures.Future[ProgramState]], pool: concurrent.futures.ThreadPoolExecutor,
              batch: ProgramBatch, name: str, progress_bar: bool) -> Iterator[ProgramState]:
    """``run_batch(generator_style=True)``: each state in order once it is done. A generator
    left before its end (closed, or Ctrl-C while it waits or in the loop reading it) stops
    the programs still running, as Ctrl-C stops ``run_batch``, and the rest never start."""
    done = False
    try:
        with tqdm(total=len(futures), desc=name, disable=not progress_bar) as bar:
            for f in futures:
                yield f.result()
                bar.update(1)
        done = True
    finally:
        if not done:
            batch.interrupt()
        pool.shutdown(wait=False, cancel_futures=True)


def _failed_state(err: Exception, backend: Any) -> ProgramState:
    chosen = _as_backend(backend) if backend is not None else _default_backend
    state = ProgramState(Program(chosen, _run_defaults(), pin_cache=False, stream=False))  # type: ignore[arg-type]
    state._error = err  # noqa: SLF001
    state.mark_finished()
    return state


def _backend_or_default(backend: Any) -> Backend:
    """``backend`` as a ``Backend``, else the default one; an error if neither is set."""
    chosen = _as_backend(backend) if backend is not None else _default_backend
    if chosen is None:
        raise RuntimeError("no backend: pass backend=... or call set_default_backend(...) first")
    return chosen


def flush_cache(backend: Any = None) -> bool:
    """Empty the server's prefix cache (the default backend's); whether it did."""
    return _backend_or_default(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """The server's settings and state (the default backend's), as ``/get_server_info``."""
    return _backend_or_default(backend).get_server_info()


def function(func: Callable[..., Any] | None = None, **_: Any) -> Any:
    """Decorator: ``@function`` makes a program of ``def prog(s, ...)``."""
    if func is None:
        return lambda f: SglFunction(f)
    return SglFunction(func)


