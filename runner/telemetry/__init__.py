"""What the runner tells its operator besides logs: Prometheus metrics and OpenTelemetry traces.

See docs/observability.md for every metric family and span.
"""

from ._metrics import CONTENT_TYPE as CONTENT_TYPE
from ._metrics import Metrics as Metrics
from ._metrics import current_metrics as current_metrics
from ._metrics import follow as follow
from ._metrics import unfollow as unfollow
from ._timeline import mark as mark
from ._tracing import Stage as Stage
from ._tracing import configure_tracing as configure_tracing
from ._tracing import configure_tracing_from_env as configure_tracing_from_env
from ._tracing import current_span as current_span
from ._tracing import enter_span as enter_span
from ._tracing import exit_span as exit_span
from ._tracing import stage as stage
from ._tracing import start_span as start_span
from ._tracing import tracing_enabled as tracing_enabled

__all__ = [
    "CONTENT_TYPE",
    "Metrics",
    "Stage",
    "configure_tracing",
    "configure_tracing_from_env",
    "current_metrics",
    "current_span",
    "enter_span",
    "exit_span",
    "follow",
    "mark",
    "stage",
    "start_span",
    "tracing_enabled",
    "unfollow",
]
