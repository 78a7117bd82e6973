"""cascade: a reasoning-serving gateway that routes each request to the cheapest tier that answers it well."""

__version__ = "0.1.0"
