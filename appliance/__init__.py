"""EIE: an edge inference appliance."""

__version__ = "0.1.0"
