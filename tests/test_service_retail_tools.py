"""Retail tools against tau2's retail DB: each tool's success path and main error paths, with tau2's strings."""

from __future__ import annotations

from pathlib import Path

import pytest

from service_calls import err, ok
from turnforge.envs.service.domain import load_domain

TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
pytestmark = pytest.mark.skipif(not (TAU2 / "retail" / "db.json").is_file(), reason="../shared/data/tau2 absent")

YUSUF = "yusuf_rossi_9620"  # credit card only; pending #W6247578 (T-Shirt), delivered #W2378156
ETHAN = "ethan_lopez_6291"  # gift card 49.0 + credit card; pending #W6779827 paid by the gift card


@pytest.fixture()
def tools():
    domain = load_domain("retail", str(TAU2 / "retail"))
    return domain.toolkit(domain.new_db())


def test_sixteen_tools_with_tau2_names():
    domain = load_domain("retail", str(TAU2 / "retail"))
    assert sorted(domain.tool_kinds()) == sorted([
        "calculate", "cancel_pending_order", "exchange_delivered_order_items", "find_user_id_by_name_zip",
        "find_user_id_by_email", "get_order_details", "get_product_details", "get_item_details", "get_user_details",
        "list_all_product_types", "modify_pending_order_address", "modify_pending_order_items",
        "modify_pending_order_payment", "modify_user_address", "return_delivered_order_items",
        "transfer_to_human_agents"])


def test_lookups(tools):
    assert ok(tools, "find_user_id_by_email", email="YUSUF.rossi7301@example.com") == YUSUF
    assert err(tools, "find_user_id_by_email", email="x@y.z") == "Error: User not found"
    assert ok(tools, "find_user_id_by_name_zip", first_name="yusuf", last_name="Rossi", zip="19122") == YUSUF
    assert err(tools, "find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi", zip="00000") == "Error: User not found"
    assert ok(tools, "get_user_details", user_id=YUSUF)["email"] == "yusuf.rossi7301@example.com"
    assert err(tools, "get_user_details", user_id="nobody") == "Error: User not found"
    assert ok(tools, "get_order_details", order_id="#W6247578")["status"] == "pending"
    assert err(tools, "get_order_details", order_id="W6247578") == "Error: Order not found"
    assert ok(tools, "get_product_details", product_id="1656367028")["name"] == "Mechanical Keyboard"
    assert err(tools, "get_product_details", product_id="1") == "Error: Product not found"
    item = ok(tools, "get_item_details", item_id="7706410293")
    assert item["price"] == 269.16 and item["available"] is True
    assert err(tools, "get_item_details", item_id="1") == "Error: Item not found"
    products = ok(tools, "list_all_product_types")
    assert products["Mechanical Keyboard"] == "1656367028" and len(products) == 50


def test_calculate_and_transfer(tools):
    assert ok(tools, "calculate", expression="(269.16 - 272.33) * 2") == -6.34
    assert err(tools, "calculate", expression="2 ^ 8") == "Error: Invalid characters in expression"
    assert ok(tools, "transfer_to_human_agents", summary="wants a human") == "Transfer successful"
    assert err(tools, "no_such_tool") == "Error: Tool 'no_such_tool' not found."
    assert "missing 1 required positional argument: 'reason'" in err(tools, "cancel_pending_order", order_id="#W6247578")


def test_cancel_pending_order(tools):
    assert err(tools, "cancel_pending_order", order_id="#W6247578", reason="too expensive") == "Error: Invalid reason"
    assert err(tools, "cancel_pending_order", order_id="#W2378156", reason="no longer needed") == \
        "Error: Non-pending order cannot be cancelled"
    order = ok(tools, "cancel_pending_order", order_id="#W6247578", reason="no longer needed")
    assert order["status"] == "cancelled" and order["cancel_reason"] == "no longer needed"
    assert order["payment_history"][-1] == {"transaction_type": "refund", "amount": 53.27,
                                            "payment_method_id": "credit_card_9513926"}


def test_cancel_refunds_a_gift_card_at_once(tools):
    ok(tools, "cancel_pending_order", order_id="#W6779827", reason="ordered by mistake")
    assert tools.db.users[ETHAN].payment_methods["gift_card_7219486"].balance == round(49.0 + 4079.45, 2)


def test_modify_pending_order_items(tools):
    assert err(tools, "modify_pending_order_items", order_id="#W6247578", item_ids=["3799046073"],
               new_item_ids=["3799046073"], payment_method_id="credit_card_9513926") == \
        "Error: The new item id should be different from the old item id"
    assert err(tools, "modify_pending_order_items", order_id="#W6247578", item_ids=["1"], new_item_ids=["2"],
               payment_method_id="credit_card_9513926") == "Error: 1 not found"
    assert err(tools, "modify_pending_order_items", order_id="#W6247578", item_ids=["3799046073"], new_item_ids=[],
               payment_method_id="credit_card_9513926") == "Error: The number of items to be exchanged should match"
    assert err(tools, "modify_pending_order_items", order_id="#W6247578", item_ids=["3799046073"],
               new_item_ids=["7706410293"], payment_method_id="credit_card_9513926") == "Error: Variant not found"
    assert err(tools, "modify_pending_order_items", order_id="#W6247578", item_ids=["3799046073"],
               new_item_ids=["9612497925"], payment_method_id="paypal_1") == "Error: Payment method not found"
    order = ok(tools, "modify_pending_order_items", order_id="#W6247578", item_ids=["3799046073"],
               new_item_ids=["9612497925"], payment_method_id="credit_card_9513926")
    assert order["status"] == "pending (item modified)"
    assert order["items"][0]["item_id"] == "9612497925" and order["items"][0]["price"] == 50.88
    assert order["payment_history"][-1]["transaction_type"] == "refund"
    assert err(tools, "modify_pending_order_items", order_id="#W6247578", item_ids=["9612497925"],
               new_item_ids=["8124970213"], payment_method_id="credit_card_9513926") == \
        "Error: Non-pending order cannot be modified"


def test_modify_items_gift_card_balance(tools):
    # Espresso machine 3203.76 -> 3081.91 is cheaper; dumbbells 457.81 -> 534.84 costs 77.03 > 49.0 balance
    assert err(tools, "modify_pending_order_items", order_id="#W6779827", item_ids=["7896397433"],
               new_item_ids=["2444431651"], payment_method_id="gift_card_7219486") == \
        "Error: Insufficient gift card balance to pay for the new item"
    ok(tools, "modify_pending_order_items", order_id="#W6779827", item_ids=["3379843752"],
       new_item_ids=["7407838442"], payment_method_id="gift_card_7219486")
    assert tools.db.users[ETHAN].payment_methods["gift_card_7219486"].balance == round(49.0 + 3203.76 - 3081.91, 2)


def test_modify_pending_order_address_and_user_address(tools):
    address = dict(address1="1 Main St", address2="", city="Austin", state="TX", country="USA", zip="73301")
    assert ok(tools, "modify_pending_order_address", order_id="#W6247578", **address)["address"]["city"] == "Austin"
    assert err(tools, "modify_pending_order_address", order_id="#W2378156", **address) == \
        "Error: Non-pending order cannot be modified"
    assert ok(tools, "modify_user_address", user_id=YUSUF, **address)["address"]["zip"] == "73301"
    assert err(tools, "modify_user_address", user_id="nobody", **address) == "Error: User not found"


def test_modify_pending_order_payment(tools):
    assert err(tools, "modify_pending_order_payment", order_id="#W6779827", payment_method_id="gift_card_7219486") == \
        "Error: The new payment method should be different from the current one"
    assert err(tools, "modify_pending_order_payment", order_id="#W2378156", payment_method_id="x") == \
        "Error: Non-pending order cannot be modified"
    order = ok(tools, "modify_pending_order_payment", order_id="#W6779827", payment_method_id="credit_card_9789590")
    assert [p["transaction_type"] for p in order["payment_history"]] == ["payment", "payment", "refund"]
    assert tools.db.users[ETHAN].payment_methods["gift_card_7219486"].balance == round(49.0 + 4079.45, 2)
    assert err(tools, "modify_pending_order_payment", order_id="#W6779827", payment_method_id="gift_card_7219486") == \
        "Error: There should be exactly one payment for a pending order"


def test_exchange_and_return_delivered_items(tools):
    args = dict(order_id="#W2378156", item_ids=["1151293680"], payment_method_id="credit_card_9513926")
    assert err(tools, "exchange_delivered_order_items", **{**args, "order_id": "#W6247578"}, new_item_ids=["7706410293"]) \
        == "Error: Non-delivered order cannot be exchanged"
    assert err(tools, "exchange_delivered_order_items", **{**args, "item_ids": ["1"]}, new_item_ids=["7706410293"]) \
        == "Error: Number of 1 not found."
    assert err(tools, "exchange_delivered_order_items", **args, new_item_ids=["9690244451"]) == \
        "Error: New item 9690244451 not found or available"
    order = ok(tools, "exchange_delivered_order_items", **args, new_item_ids=["7706410293"])
    assert order["status"] == "exchange requested" and order["exchange_price_difference"] == -3.17
    assert err(tools, "return_delivered_order_items", **args) == "Error: Non-delivered order cannot be returned"


def test_return_delivered_order_items(tools):
    assert err(tools, "return_delivered_order_items", order_id="#W6679257", item_ids=["5996159312"],
               payment_method_id="gift_card_1") == "Error: Payment method not found"
    assert err(tools, "return_delivered_order_items", order_id="#W6679257", item_ids=["1"],
               payment_method_id="credit_card_9513926") == "Error: Some item not found"
    order = ok(tools, "return_delivered_order_items", order_id="#W6679257", item_ids=["5996159312"],
               payment_method_id="credit_card_9513926")
    assert order["status"] == "return requested" and order["return_items"] == ["5996159312"]
