"""One error hierarchy for the engine. Each error carries the HTTP status and the
OpenAI-style error type the API answers with, so the API maps them in one place."""

from __future__ import annotations


class HomerackError(Exception):
    status = 500
    kind = "server_error"
    param: str | None = None

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        if param is not None:
            self.param = param


class ModelNotFound(HomerackError):
    status = 404
    kind = "model_not_found"
    param = "model"


class NotFound(HomerackError):
    """A thing the request names that is not there (a paired device, a conversation)."""
    status = 404
    kind = "not_found"


class InvalidModelFile(HomerackError):
    """Not a GGUF file, or a truncated one. Checked before llama.cpp opens it,
    because llama.cpp can abort the whole process on a bad file."""
    status = 400
    kind = "invalid_model_file"
    param = "model"


class BackendLoadFailed(HomerackError):
    """llama.cpp's backends could not be loaded as asked (HOMERACK_CPU_VARIANT)."""
    kind = "backend_load_failed"


class ModelLoadFailed(HomerackError):
    status = 500
    kind = "model_load_failed"
    param = "model"


class OutOfMemory(ModelLoadFailed):
    """llama.cpp could not allocate a buffer on `device` while loading."""
    kind = "out_of_memory"

    def __init__(self, message: str, device: str):
        super().__init__(message)
        self.device = device


class InvalidRequest(HomerackError):
    status = 400
    kind = "invalid_request_error"


class TemplateStopped(InvalidRequest):
    """A model's chat template that ran past its budget (catalog/template_budget.py):
    the request fails where it is rendered, and it is not rendered again."""


class GrammarTooSlow(InvalidRequest):
    """A request's grammar took longer to check its output than the budget allows: the
    sequence ends, and the others of the step go on."""


class NonFiniteLogits(HomerackError):
    """The model computed logits that are not numbers (NaN or infinite) for a sequence:
    the sequence ends with this, the others of the step go on. Raised where logits are
    read (llama/runtime.py) without a position; the scheduler adds it (`at`)."""
    kind = "model_error"

    def __init__(self, model: str, device: str, what: str, position: int | None = None):
        self.model, self.device, self.what, self.position = model, device, what, position
        where = f" at token position {position:,}" if position is not None else ""
        super().__init__(
            f"the model {model} computed {what} logits on {device}{where}: its weights hold "
            "NaN or its activations overflow (a damaged or badly quantized file, half "
            "precision overflowing in some architectures, a GPU driver fault). This "
            "request ended there; the others go on. Try another quantization of the "
            "model, or run it on the CPU (--gpu-layers 0) to tell the file from the device.")

    def at(self, position: int) -> "NonFiniteLogits":
        return NonFiniteLogits(self.model, self.device, self.what, position)


class SpeechFailed(HomerackError):
    """The speech synthesizer's child process died or ran past its time on a request:
    that request fails, the engine and the next request go on (voice/speaker.py)."""
    kind = "speech_error"


class NotSupported(HomerackError):
    """A route or field of another API that this engine does not offer."""
    status = 501
    kind = "not_supported"


class ContextLengthExceeded(InvalidRequest):
    kind = "context_length_exceeded"
    param = "messages"


class StoppedBeforeStart(HomerackError):
    """The asker's own Stop came before the first token: nothing was answered or kept."""
    status = 409
    kind = "stopped"


class QueueFull(HomerackError):
    status = 503
    kind = "queue_full"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RateLimited(HomerackError):
    """A paired device over one of its limits (requests at once, tokens a minute), or
    pairing locked after too many wrong codes: retry after `retry_after_s`."""
    status = 429
    kind = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: int, param: str | None = None):
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class StarterModelMissing(HomerackError):
    status = 500
    kind = "starter_model_missing"


class Unauthorized(HomerackError):
    status = 401
    kind = "invalid_api_key"


class MemoryFull(HomerackError):
    """The KV memory shared by all sequences ran out while this one grew."""
    status = 503
    kind = "kv_memory_full"


class ModelUnloaded(HomerackError):
    """The model a request waited for was unloaded (the routing pair changed)."""
    status = 503
    kind = "model_unloaded"


class WorkerLost(HomerackError):
    """A worker holding layers of the loaded model went away: the engine answers what was
    in flight with this, then restarts and plans without it."""
    status = 503
    kind = "worker_lost"


class Forbidden(HomerackError):
    """The request asks for what the user has not enabled (a tool server it names)."""
    status = 403
    kind = "permission_error"


class ToolServerFailed(HomerackError):
    """An MCP server would not start or answer: said in words, with its log's tail."""
    status = 502
    kind = "tool_server_error"
