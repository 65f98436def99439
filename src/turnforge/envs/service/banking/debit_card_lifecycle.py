"""Ordering and activating debit cards (tau2-bench `banking_knowledge/tools.py` order_debit_card_5739 and the three
activate_debit_card_829x tools, one per issue reason), with tau2's checks, fees, card records and texts.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.card_tools import titled
from turnforge.envs.service.banking.discoverable import discoverable, named_as
from turnforge.envs.service.toolkit import ToolKind

ACTIVATOR = {"new_account": "activate_debit_card_8291", "first_card": "activate_debit_card_8291",
             "lost": "activate_debit_card_8292", "stolen": "activate_debit_card_8292",
             "fraud": "activate_debit_card_8292", "expired": "activate_debit_card_8293",
             "damaged": "activate_debit_card_8293", "upgrade": "activate_debit_card_8293",
             "bank_reissue": "activate_debit_card_8293"}
DELIVERY = {"STANDARD": "7-10 business days", "EXPEDITED": "3-5 business days", "RUSH": "1-2 business days"}
_ACTIVATE_ARGS = """Args:
            card_id (string): The debit card ID to activate
            last_4_digits (string): Last 4 digits of the card number (for verification)
            expiration_date (string): Card expiration date in MM/YY format
            cvv (string): 3-digit CVV from the back of the card
            pin (string): 4-digit PIN chosen by the customer"""


def activation_error(db: Any, args: dict, allowed: list[str], tool_name: str) -> tuple[str | None, dict | None]:
    """tau2's `_validate_activation_common`: (error, None) or (None, the card)."""
    from turnforge.envs.service.banking.debit_tools import pin_problem

    if not all(args.values()):
        return "Error: Missing required parameters. Required: card_id, last_4_digits, expiration_date, cvv, pin.", None
    if problem := pin_problem(args["pin"]):
        return f"Error: {problem}", None
    if not args["cvv"].isdigit() or len(args["cvv"]) != 3:
        return "Error: CVV must be exactly 3 digits.", None
    if not args["last_4_digits"].isdigit() or len(args["last_4_digits"]) != 4:
        return "Error: Last 4 digits must be exactly 4 digits.", None
    card = db.debit_cards.data.get(args["card_id"])
    if card is None:
        return f"Error: Debit card '{args['card_id']}' not found.", None
    reason = card.get("issue_reason", "new_account")
    if reason not in allowed:
        return (f"Error: Wrong activation tool. This card has issue_reason='{reason}'. Please use "
                f"{ACTIVATOR.get(reason, 'unknown')} instead of {tool_name}."), None
    if card.get("status") == "ACTIVE":
        return f"Error: Debit card '{args['card_id']}' is already active.", None
    if card.get("status") != "PENDING":
        return (f"Error: Debit card '{args['card_id']}' cannot be activated. Current status: {card.get('status')}. "
                "Only PENDING cards can be activated."), None
    if card.get("last_4_digits") != args["last_4_digits"]:
        return "Error: Card verification failed. The last 4 digits do not match our records.", None
    account_id = card.get("account_id")
    if account_id and account_id in db.accounts.data and db.accounts.data[account_id].get("status") != "OPEN":
        return (f"Error: The linked checking account '{account_id}' is no longer open. Card cannot be "
                "activated."), None
    return None, card


def expiration_in_four_years(order_date: str) -> str:
    """tau2's card expiry: the order month, its last day (February 28), four years on."""
    try:
        parts = order_date.split("/")
        month, year = parts[0], str(int(parts[2]) + 4)
    except (ValueError, IndexError):
        return "12/31/2029"
    day = "31" if month in ["01", "03", "05", "07", "08", "10", "12"] else "28" if month == "02" else "30"
    return f"{month}/{day}/{year}"


def issue_reason(db: Any, account_id: str) -> str:
    """tau2's rule: a replacement of a closed lost / stolen / fraud card keeps that reason; otherwise first card or new
    account."""
    existing = [c for c in db.debit_cards.data.values() if c.get("account_id") == account_id]
    closed = next((c for c in existing if c.get("status") == "CLOSED"), None)
    if closed:
        reason = closed.get("closure_reason", "first_card")
        if reason in ["lost", "stolen", "fraud", "fraud_suspected"]:
            return reason if reason != "fraud_suspected" else "fraud"
        return "first_card"
    return "first_card" if existing else "new_account"


def fee_parts(delivery_fee: float, design_fee: float, excess: float, sep: str) -> list[str]:
    parts = [f"Delivery{sep}${delivery_fee}"] if delivery_fee > 0 else []
    parts += [f"Design{sep}${design_fee}"] if design_fee > 0 else []
    return parts + ([f"Excess Replacement{sep}${excess:.0f}"] if excess > 0 else [])


class DebitCardLifecycle:
    """Order and activate debit cards over `self.db`."""

    db: Any

    @discoverable(ToolKind.WRITE)
    def order_debit_card_5739(self, account_id: str, user_id: str, delivery_option: str, delivery_fee: float,
                              card_design: str, design_fee: float, shipping_address: str,
                              excess_replacement_fee: float | None = None) -> str:
        """Order a new debit card for a customer's checking account.

        Args:
            account_id (string): The checking account ID to link the debit card to
            user_id (string): The customer's unique identifier
            delivery_option (string): Shipping speed: STANDARD, EXPEDITED, or RUSH
            delivery_fee (number): Fee to charge for delivery in dollars
            card_design (string): Card design: CLASSIC, PREMIUM, or CUSTOM
            design_fee (number): Fee to charge for card design in dollars
            shipping_address (string): Full shipping address for card delivery
            excess_replacement_fee (number, optional): Fee for exceeding replacement limit, if applicable

        Returns:
            Debit card order placed successfully.
        """
        excess = excess_replacement_fee or 0
        try:
            delivery_fee = float(delivery_fee) if delivery_fee is not None else None
        except (TypeError, ValueError):
            return "Error: delivery_fee must be a number."
        try:
            design_fee = float(design_fee) if design_fee is not None else None
        except (TypeError, ValueError):
            return "Error: design_fee must be a number."
        try:
            excess = float(excess)
        except (TypeError, ValueError):
            excess = 0
        if not all([account_id, user_id, delivery_option, delivery_fee is not None, card_design,
                    design_fee is not None, shipping_address]):
            return ("Error: Missing required parameters. Required: account_id, user_id, delivery_option, delivery_fee, "
                    "card_design, design_fee, shipping_address.")
        if delivery_option.upper() not in DELIVERY:
            return f"Error: Invalid delivery_option. Must be one of: {list(DELIVERY)}"
        if card_design.upper() not in ["CLASSIC", "PREMIUM", "CUSTOM"]:
            return f"Error: Invalid card_design. Must be one of: {['CLASSIC', 'PREMIUM', 'CUSTOM']}"
        delivery_option, card_design = delivery_option.upper(), card_design.upper()
        error, holdings = self._order_checks(account_id, user_id, delivery_fee + design_fee + excess)
        if error:
            return error
        total = delivery_fee + design_fee + excess
        today, order = tables.today_str(), "dcord_" + tables.hex_id(
            f"debit_card_order:{account_id}:{user_id}:{delivery_option}", 12)
        record = {"order_id": order, "account_id": account_id, "user_id": user_id, "delivery_option": delivery_option,
                  "card_design": card_design, "shipping_address": shipping_address, "delivery_fee": delivery_fee,
                  "design_fee": design_fee, "excess_replacement_fee": excess, "total_fee": total, "order_date": today,
                  "expected_delivery": DELIVERY[delivery_option], "status": "PENDING"}
        if not tables.add(self.db, "debit_card_orders", order, record):
            return "Error: Failed to create debit card order. Order may already exist."
        if total > 0:
            self._charge_order_fee(account_id, order, holdings, total, fee_parts(delivery_fee, design_fee, excess, " "))
        card = self._new_pending_card(account_id, user_id, card_design)
        parts = ["Debit Card Order Confirmed", f"Order ID: {order}", f"Card ID: {card}", f"Linked Account: {account_id}",
                 f"Delivery Option: {delivery_option}", f"Card Design: {card_design}",
                 f"Shipping Address: {shipping_address}", f"Expected Delivery: {DELIVERY[delivery_option]}", "",
                 "Note: Card will arrive with status PENDING. Customer must call to activate after receiving the card."]
        if total > 0:
            parts += [f"Total Fees: ${total:.2f} ({', '.join(fee_parts(delivery_fee, design_fee, excess, ': '))}) - "
                      f"CHARGED to account {account_id}", f"New Account Balance: ${holdings - total:.2f}"]
        else:
            parts.append("Total Fees: $0 (No additional charges)")
        return "\n".join(parts)

    def _order_checks(self, account_id: str, user_id: str, total: float) -> tuple[str | None, float]:
        """tau2's order checks: an open checking account of the user with $25 and the fees, no pending order, no
        active card. (error, the account's holdings)."""
        account = self.db.accounts.data.get(account_id)
        if account is None:
            return f"Error: Account '{account_id}' not found.", 0.0
        if account.get("class") != "checking":
            return (f"Error: Debit cards can only be ordered for checking accounts. Account '{account_id}' is a "
                    f"{account.get('class')} account."), 0.0
        if account.get("status") != "OPEN":
            return f"Error: Account must be OPEN. Account '{account_id}' has status: {account.get('status')}", 0.0
        if account.get("user_id") != user_id:
            return f"Error: Account '{account_id}' does not belong to user '{user_id}'.", 0.0
        try:
            holdings = float(str(account.get("current_holdings", "0")).replace(",", ""))
        except ValueError:
            holdings = 0.0
        if holdings < 25.0:
            return f"Error: Account must have a minimum balance of $25. Current balance: ${holdings:.2f}", holdings
        if any(o.get("account_id") == account_id and o.get("status") == "PENDING"
               for o in self.db.debit_card_orders.data.values()):
            return f"Error: There is already a pending debit card order for account '{account_id}'.", holdings
        if any(c.get("account_id") == account_id and c.get("status") == "ACTIVE"
               for c in self.db.debit_cards.data.values()):
            return (f"Error: Account '{account_id}' already has an active debit card. Maximum 1 active card per "
                    "checking account."), holdings
        if total > 0 and holdings < total:
            return (f"Error: Insufficient funds for fees. Total fees: ${total:.2f}. Current balance: "
                    f"${holdings:.2f}"), holdings
        return None, holdings

    def _charge_order_fee(self, account_id: str, order: str, holdings: float, total: float, parts: list[str]) -> None:
        self.db.accounts.data[account_id]["current_holdings"] = f"{holdings - total:.2f}"
        txn = f"btxn_dcfee_{order[-8:]}"
        tables.add(self.db, "bank_account_transaction_history", txn, {
            "transaction_id": txn, "account_id": account_id, "date": tables.today_str(),
            "description": f"DEBIT CARD ORDER FEE - {', '.join(parts)}", "amount": -total, "type": "debit_card_fee",
            "status": "posted"})

    def _new_pending_card(self, account_id: str, user_id: str, design: str) -> str:
        """The ordered card, PENDING, with tau2's deterministic number, CVV, name and expiry; its id."""
        today = tables.today_str()
        card = "dbc_" + tables.hex_id(f"debit_card:{account_id}:{user_id}:{today}", 12)
        last_4 = "".join(c for c in tables.hex_id(f"card_details:{card}:last4", 8) if c.isdigit())[:4].zfill(4)
        cvv = "".join(c for c in tables.hex_id(f"card_details:{card}:cvv", 6) if c.isdigit())[:3].zfill(3)
        user = self.db.users.data.get(user_id)
        name = user.get("name", "CARDHOLDER").upper() if user is not None else "CARDHOLDER"
        reason = issue_reason(self.db, account_id)
        tables.add(self.db, "debit_cards", card, {
            "card_id": card, "account_id": account_id, "user_id": user_id, "cardholder_name": name,
            "last_4_digits": last_4, "cvv": cvv, "status": "PENDING", "issue_date": today,
            "expiration_date": expiration_in_four_years(today), "card_design": design, "issue_reason": reason})
        return card

    def _activate(self, args: dict, allowed: list[str], tool_name: str, old_status: str, note: str
                  ) -> tuple[str | None, dict | None, list[str]]:
        """Checks, then the card ACTIVE and the account's other active cards set to `old_status`."""
        error, card = activation_error(self.db, args, allowed, tool_name)
        if error:
            return error, None, []
        today = tables.today_str()
        card.update(status="ACTIVE", activated_date=today)
        others = []
        for other_id, other in self.db.debit_cards.data.items():
            if other_id != args["card_id"] and other.get("account_id") == card.get("account_id") and \
                    other.get("status") == "ACTIVE":
                other = self.db.debit_cards.data[other_id]  # by key: the episode's own copy (episode_db.py)
                other["status"] = old_status
                other["deactivated_date" if old_status == "DEACTIVATED" else "grace_period_ends"] = today
                other["deactivation_reason"] = note
                others.append(other_id)
        return None, card, others

    @discoverable(ToolKind.WRITE)
    def activate_debit_card_8291(self, card_id: str, last_4_digits: str, expiration_date: str, cvv: str,
                                 pin: str) -> str:
        """Activate a NEW debit card for a customer. Use ONLY for first-time cards on a checking account (issue_reason = 'new_account' or 'first_card'). For replacement or reissued cards, use the appropriate variant.

        {args}

        Returns:
            New debit card activated successfully.
        """
        args = {"card_id": card_id, "last_4_digits": last_4_digits, "expiration_date": expiration_date, "cvv": cvv,
                "pin": pin}
        error, card, others = self._activate(args, ["new_account", "first_card"], "activate_debit_card_8291",
                                             "DEACTIVATED", "New card activated")
        if error:
            return error
        parts = ["New Debit Card Activation Successful", f"Card ID: {card_id}", "Status: ACTIVE",
                 f"Activation Date: {tables.today_str()}", "",
                 "Your card is now ready to use at any ATM or point of sale terminal.",
                 "For security, please sign the back of your card."]
        if others:
            parts.append(f"\nNote: Previous card(s) have been deactivated: {', '.join(others)}")
        return "\n".join(parts)

    @discoverable(ToolKind.WRITE)
    def activate_debit_card_8292(self, card_id: str, last_4_digits: str, expiration_date: str, cvv: str,
                                 pin: str) -> str:
        """Activate a REPLACEMENT debit card. Use ONLY for cards replacing lost, stolen, or fraud-suspected cards (issue_reason = 'lost', 'stolen', or 'fraud'). For new or reissued cards, use the appropriate variant.

        {args}

        Returns:
            Replacement debit card activated successfully.
        """
        args = {"card_id": card_id, "last_4_digits": last_4_digits, "expiration_date": expiration_date, "cvv": cvv,
                "pin": pin}
        card = self.db.debit_cards.data.get(card_id) or {}
        reason = card.get("issue_reason", "lost")
        error, card, others = self._activate(args, ["lost", "stolen", "fraud"], "activate_debit_card_8292",
                                             "DEACTIVATED", f"Replacement card activated ({reason})")
        if error:
            return error
        parts = ["Replacement Debit Card Activation Successful", f"Card ID: {card_id}",
                 f"Replacement Reason: {titled(reason)}", "Status: ACTIVE", f"Activation Date: {tables.today_str()}",
                 "", "Your replacement card is now ready to use.", "", "IMPORTANT SECURITY REMINDERS:",
                 "- Please review your recent transactions for any unauthorized charges",
                 "- Report any suspicious activity immediately"]
        if reason == "fraud":
            parts.append("- Since fraud was suspected, we recommend changing your online banking password")
        if others:
            parts.append(f"\nPrevious card(s) have been deactivated for security: {', '.join(others)}")
        return "\n".join(parts)

    @discoverable(ToolKind.WRITE)
    def activate_debit_card_8293(self, card_id: str, last_4_digits: str, expiration_date: str, cvv: str,
                                 pin: str) -> str:
        """Activate a REISSUED debit card. Use ONLY for cards reissued due to expiration, damage, design upgrade, or bank-initiated replacement (issue_reason = 'expired', 'damaged', 'upgrade', or 'bank_reissue'). For new or replacement cards, use the appropriate variant.

        {args}

        Returns:
            Reissued debit card activated successfully.
        """
        args = {"card_id": card_id, "last_4_digits": last_4_digits, "expiration_date": expiration_date, "cvv": cvv,
                "pin": pin}
        card = self.db.debit_cards.data.get(card_id) or {}
        reason = card.get("issue_reason", "expired")
        error, card, others = self._activate(args, ["expired", "damaged", "upgrade", "bank_reissue"],
                                             "activate_debit_card_8293", "GRACE_PERIOD",
                                             f"Reissued card activated ({reason})")
        if error:
            return error
        parts = ["Reissued Debit Card Activation Successful", f"Card ID: {card_id}",
                 f"Reissue Reason: {titled(reason)}", "Status: ACTIVE", f"Activation Date: {tables.today_str()}", "",
                 "Your reissued card is now ready to use."]
        if others:
            parts += [f"\nNote: Your previous card(s) ({', '.join(others)}) will remain active for 24 hours as a grace "
                      "period.", "After 24 hours, the old card(s) will be automatically deactivated."]
        if reason in ["expired", "bank_reissue"]:
            parts.append("\nReminder: If your card number changed, please update any recurring payments with your new "
                         "card details.")
        return "\n".join(parts)


for _name in ("activate_debit_card_8291", "activate_debit_card_8292", "activate_debit_card_8293"):
    _method = getattr(DebitCardLifecycle, _name)
    _method.__doc__ = _method.__doc__.replace("{args}", _ACTIVATE_ARGS)
named_as("KnowledgeTools", DebitCardLifecycle)
