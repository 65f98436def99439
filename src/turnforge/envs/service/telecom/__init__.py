"""The telecom domain (tau2-bench `domains/telecom/`): tech support with dual control.

    turnforge eval --env service --env-opt domain=telecom --env-opt data_dir=PATH/tau2-bench/data/tau2/domains/telecom \
        --policy expert --out runs/telecom-gold

The agent works on the carrier's DB (tools.py); the customer works on their own phone (device_tools.py, the user
role's tools). After every step `sync` carries each side's state to the other, as tau2's
`TelecomEnvironment.sync_tools`: whether the line is active, roaming allowed, the data allowance used up, and
payment requests (a bill awaiting payment appears on the phone; a paid request marks the bill paid). The agent's
policy is tau2's "manual" variant: `main_policy.md` and `tech_support_manual.md` in tags.
"""

from __future__ import annotations

from pathlib import Path

from turnforge.envs.service.domain import DomainKind, UserSide
from turnforge.envs.service.telecom.db import LineStatus, TelecomDB
from turnforge.envs.service.telecom.device import PaymentRequest, TelecomUserDB
from turnforge.envs.service.telecom.device_tools import DeviceTools
from turnforge.envs.service.telecom.tools import TelecomTools

POLICY_FILES = ("main_policy.md", "tech_support_manual.md")


def telecom_policy(folder: Path) -> str:
    """tau2's telecom agent policy (policy_type "manual")."""
    missing = [name for name in POLICY_FILES if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"service domain 'telecom': {folder} lacks {', '.join(missing)}")
    main, manual = ((folder / name).read_text(encoding="utf-8") for name in POLICY_FILES)
    return f"<main_policy>\n{main}\n</main_policy>\n<tech_support_policy>\n{manual}\n</tech_support_policy>"


def sync(tools: TelecomTools, device: DeviceTools) -> None:
    """Carry the carrier's state of the user's line to the phone, and the phone's payments to the bills."""
    around = device.surroundings
    if around.phone_number is None:
        return
    line = tools.line_by_phone(around.phone_number)
    around.line_active = line.status == LineStatus.ACTIVE
    around.roaming_allowed = line.roaming_enabled
    plan = tools.plan(line.plan_id)
    around.mobile_data_usage_exceeded = line.data_used_gb >= plan.data_limit_gb + line.data_refueling_gb
    if around.payment_request is not None and around.payment_request.paid:
        tools.set_bill_paid(around.payment_request.bill_id)
        around.payment_request = None
    if around.payment_request is None:
        awaiting = tools.bills_awaiting_payment(tools.get_customer_by_phone(around.phone_number))
        if awaiting:
            around.payment_request = PaymentRequest(bill_id=awaiting[0].bill_id, amount_due=awaiting[0].total_due)


TELECOM = DomainKind("telecom", TelecomDB, TelecomTools, policy_files=POLICY_FILES, compose_policy=telecom_policy,
                     user=UserSide(TelecomUserDB, DeviceTools, "user_db.toml", sync))
