"""The runner's HTTP listeners: management (private) and public."""

from ._management import create_management_app as create_management_app
