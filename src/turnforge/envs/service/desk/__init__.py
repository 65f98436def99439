"""The built-in `desk` domain: a clinic front desk (patients, doctors' free slots, appointments), no data files.

    turnforge eval --env service --env-opt domain=desk --policy expert --split test --out runs/desk-gold
"""

from __future__ import annotations

from turnforge.envs.service.desk.data import desk_data
from turnforge.envs.service.desk.db import DeskDB
from turnforge.envs.service.desk.tools import DeskTools
from turnforge.envs.service.domain import DomainKind

DESK = DomainKind("desk", DeskDB, DeskTools, builtin=desk_data)
