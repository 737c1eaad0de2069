"""The runner's HTTP listeners: management (private) and public."""

from ._management import create_management_app as create_management_app
from ._metrics import create_metrics_app as create_metrics_app
from ._public import create_public_app as create_public_app
