"""The runner's HTTP listeners: management (private) and public."""

from ._management import create_management_app as create_management_app
from ._metrics import create_metrics_app as create_metrics_app
from ._origins import OriginGuard as OriginGuard
from ._origins import OriginPolicy as OriginPolicy
from ._playground import Playground as Playground
from ._public import create_public_app as create_public_app
from ._server import HttpLimits as HttpLimits
from ._server import Listening as Listening
from ._server import listen as listen
from ._server import serve_http as serve_http

__all__ = [
    "HttpLimits",
    "Listening",
    "OriginGuard",
    "OriginPolicy",
    "Playground",
    "create_management_app",
    "create_metrics_app",
    "create_public_app",
    "listen",
    "serve_http",
]
