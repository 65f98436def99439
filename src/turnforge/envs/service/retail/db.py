"""The retail DB (tau2-bench `domains/retail/data_model.py`): products with variants, users, orders.

Same field names, types and defaults as tau2's models, so `model_dump()` (and so tau2's DB hash) is the same.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Record(BaseModel):
    """tau2's records are plain pydantic models (extra keys ignored)."""


class Variant(_Record):
    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(_Record):
    name: str
    product_id: str
    variants: dict[str, Variant]


class UserName(_Record):
    first_name: str
    last_name: str


class UserAddress(_Record):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class CreditCard(_Record):
    source: Literal["credit_card"]
    id: str
    brand: str
    last_four: str


class Paypal(_Record):
    source: Literal["paypal"]
    id: str


class GiftCard(_Record):
    source: Literal["gift_card"]
    id: str
    balance: float


PaymentMethod = CreditCard | GiftCard | Paypal


class User(_Record):
    user_id: str
    name: UserName
    address: UserAddress
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderFullfilment(_Record):  # tau2's spelling
    tracking_id: list[str]
    item_ids: list[str]


class OrderItem(_Record):
    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class OrderPayment(_Record):
    transaction_type: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


OrderStatus = Literal[
    "processed", "pending", "pending (item modified)", "delivered", "cancelled", "exchange requested",
    "return requested",
]


class Order(_Record):
    order_id: str
    user_id: str
    address: UserAddress
    items: list[OrderItem]
    status: OrderStatus
    fulfillments: list[OrderFullfilment]
    payment_history: list[OrderPayment]
    cancel_reason: Literal["no longer needed", "ordered by mistake"] | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(BaseModel):
    model_config = ConfigDict(extra="forbid")  # tau2: DB is BaseModelNoExtra

    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]
