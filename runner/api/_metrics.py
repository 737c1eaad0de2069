"""Prometheus scrapes: ``GET /v1/metrics`` on the management listener (behind its token), and
``GET /metrics`` on the optional metrics listener (``--metrics-address``: no token, for a
sidecar on the same host or network)."""

from __future__ import annotations

from quart import Response
from quart_trio import QuartTrio

from ..telemetry import CONTENT_TYPE, Metrics
from ._common import install_error_handlers


async def metrics_response(metrics: Metrics) -> Response:
    """The text exposition of ``metrics``, as of now."""
    return Response(await metrics.render(), content_type=CONTENT_TYPE)


def create_metrics_app(metrics: Metrics) -> QuartTrio:
    """The metrics listener's app: ``GET /metrics`` and nothing else."""
    app = QuartTrio("runner.metrics")
    install_error_handlers(app)

    @app.get("/metrics")
    async def scrape() -> Response:
        return await metrics_response(metrics)

    return app
