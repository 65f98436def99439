"""The telecom agent DB (tau2-bench `domains/telecom/data_model.py`): plans, customers, lines, bills, devices.

Same field names, types, defaults and enum values as tau2's models (extra keys forbidden, as its
`BaseModelNoExtra`), so `model_dump()` — and so tau2's DB hash — is the same. The collections are lists, as in
tau2 (the DB is 10 KB: an episode deep-copies it at reset).
"""

from __future__ import annotations

import datetime
import enum

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_START_DATE = datetime.date(2025, 1, 1)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Address(_Record):
    street: str
    city: str
    state: str
    zip_code: str


class Plan(_Record):
    plan_id: str
    name: str
    data_limit_gb: float
    price_per_month: float
    data_refueling_price_per_gb: float


class DeviceType(enum.StrEnum):
    PHONE = "phone"
    ROUTER = "router"
    TABLET = "tablet"
    WATCH = "watch"
    OTHER = "other"


class Device(_Record):
    device_id: str
    device_type: DeviceType
    model: str
    imei: str | None = None
    is_esim_capable: bool
    activated: bool = False
    activation_date: datetime.datetime | None = None
    last_esim_transfer_date: datetime.datetime | None = None


class LineStatus(enum.StrEnum):
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_ACTIVATION = "Pending Activation"
    CLOSED = "Closed"


class Line(_Record):
    line_id: str
    phone_number: str
    status: LineStatus = LineStatus.PENDING_ACTIVATION
    plan_id: str
    device_id: str | None = None
    data_used_gb: float = 0.0
    data_refueling_gb: float = 0.0
    roaming_enabled: bool = False
    contract_end_date: datetime.date | None = None
    last_plan_change_date: datetime.date | None = None
    last_sim_replacement_date: datetime.date | None = None
    suspension_start_date: datetime.date | None = None


class LineItem(_Record):
    description: str
    amount: float
    date: datetime.date
    item_type: str


class BillStatus(enum.StrEnum):
    DRAFT = "Draft"
    ISSUED = "Issued"
    AWAITING_PAYMENT = "Awaiting Payment"
    PAID = "Paid"
    OVERDUE = "Overdue"
    DISPUTED = "Disputed"


class Bill(_Record):
    bill_id: str
    customer_id: str
    period_start: datetime.date
    period_end: datetime.date
    issue_date: datetime.date
    total_due: float
    due_date: datetime.date
    line_items: list[LineItem] = Field(default_factory=list)
    status: BillStatus = BillStatus.DRAFT


class AccountStatus(enum.StrEnum):
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_VERIFICATION = "Pending Verification"
    CLOSED = "Closed"


class PaymentMethodType(enum.StrEnum):
    CREDIT_CARD = "Credit Card"
    DEBIT_CARD = "Debit Card"
    PAYPAL = "PayPal"


class PaymentMethod(_Record):
    method_type: PaymentMethodType
    account_number_last_4: str
    expiration_date: str


class Customer(_Record):
    customer_id: str
    full_name: str
    date_of_birth: str
    email: str
    phone_number: str
    address: Address
    account_status: AccountStatus = AccountStatus.PENDING_VERIFICATION
    payment_methods: list[PaymentMethod] = Field(default_factory=list)
    line_ids: list[str] = Field(default_factory=list)
    bill_ids: list[str] = Field(default_factory=list)
    created_at: datetime.datetime = DEFAULT_START_DATE  # type: ignore[assignment]  # tau2's default is a date
    last_extension_date: datetime.date | None = None
    goodwill_credit_used_this_year: float = 0.0


class TelecomDB(_Record):
    plans: list[Plan] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)
    lines: list[Line] = Field(default_factory=list)
    bills: list[Bill] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)
