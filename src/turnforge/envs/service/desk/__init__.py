"""The built-in `desk` domain (placeholder until its module lands)."""
from turnforge.envs.service.domain import DomainKind  # noqa: F401
DESK = None
