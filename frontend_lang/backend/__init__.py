"""DSL backends: ``EngineBackend`` (in-process) and ``RuntimeEndpoint`` (HTTP)."""

from frontend_lang.backend.base import Backend, BackendError
from frontend_lang.backend.engine import EngineBackend
from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint

__all__ = ["Backend", "BackendError", "EngineBackend", "RuntimeEndpoint"]
