"""The agent's discoverable debit-card tools (tau2-bench `banking_knowledge/tools.py`): order, activate (three
variants by the card's issue reason), close, freeze / unfreeze, clear alerts, PINs, list cards and temporary
limits, with tau2's checks, records and texts.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.card_tools import titled
from turnforge.envs.service.banking.debit_card_lifecycle import DebitCardLifecycle
from turnforge.envs.service.banking.discoverable import discoverable, named_as
from turnforge.envs.service.toolkit import ToolKind

DEFAULT_ATM_LIMITS = {"blue account": 500, "green account": 600, "light blue account": 400,
                      "green fee-free account": 500, "evergreen account": 750, "bluest account": 1500,
                      "dark green account": 300, "gold years account": 600, "purple account": 1000}
SEQUENTIAL_PINS = ["0123", "1234", "2345", "3456", "4567", "5678", "6789", "9876", "8765", "7654", "6543", "5432",
                   "4321", "3210"]


def pin_problem(pin: str) -> str | None:
    """tau2's `_validate_pin`."""
    if not pin or not pin.isdigit() or len(pin) != 4:
        return "PIN must be exactly 4 digits."
    if pin in SEQUENTIAL_PINS:
        return "PIN cannot be sequential (e.g., 1234). Please choose a more secure PIN."
    if len(set(pin)) == 1:
        return "PIN cannot be all the same digit (e.g., 1111). Please choose a more secure PIN."
    return None


class DebitCardTools(DebitCardLifecycle):
    """Discoverable debit-card tools over `self.db` (activation and ordering in debit_card_lifecycle.py)."""

    db: Any

    def _card(self, card_id: str) -> dict | None:
        return self.db.debit_cards.data.get(card_id)

    @discoverable(ToolKind.WRITE)
    def close_debit_card_4721(self, card_id: str, reason: str) -> str:
        """Close or cancel a debit card permanently.

        Args:
            card_id (string): The debit card ID to close
            reason (string): Reason for closing: lost, stolen, fraud_suspected, damaged, no_longer_needed, or account_closing

        Returns:
            Debit card closed successfully.
        """
        if not card_id or not reason:
            return "Error: Missing required parameters. Required: card_id, reason."
        valid = ["lost", "stolen", "fraud_suspected", "damaged", "no_longer_needed", "account_closing"]
        if reason.lower() not in valid:
            return f"Error: Invalid reason. Must be one of: {valid}"
        reason = reason.lower()
        card = self._card(card_id)
        if card is None:
            return f"Error: Debit card '{card_id}' not found."
        if card.get("status") not in ["ACTIVE", "PENDING"]:
            return (f"Error: Debit card '{card_id}' cannot be closed. Current status: {card.get('status')}. "
                    "Only ACTIVE or PENDING cards can be closed.")
        previous = card.get("status")
        card.update(status="CLOSED", closed_date=tables.today_str(), closure_reason=reason)
        parts = ["Debit Card Closed Successfully", f"Card ID: {card_id}", f"Previous Status: {previous}",
                 "New Status: CLOSED", f"Closure Reason: {titled(reason)}", f"Closure Date: {tables.today_str()}", ""]
        if reason in ["lost", "stolen", "fraud_suspected"]:
            parts += ["IMPORTANT: This card has been immediately deactivated for security.",
                      "Any pending transactions may still be processed."]
            if reason == "fraud_suspected":
                parts += ["Please advise the customer to review recent transactions and file disputes for any "
                          "unauthorized charges.", "Also recommend changing their online banking password."]
        parts += ["", "Note: This card cannot be reactivated. If the customer needs a new card, they can order one "
                  "through the standard ordering process.",
                  "Any recurring payments linked to this card will need to be updated with new payment information."]
        return "\n".join(parts)

    @discoverable(ToolKind.WRITE)
    def freeze_debit_card_3892(self, card_id: str) -> str:
        """Temporarily freeze a debit card. The card can be unfrozen later.

        Args:
            card_id (string): The debit card ID to freeze

        Returns:
            Debit card frozen successfully.
        """
        if not card_id:
            return "Error: Missing required parameter: card_id."
        card = self._card(card_id)
        if card is None:
            return f"Error: Debit card '{card_id}' not found."
        if card.get("status") == "FROZEN":
            return f"Error: Debit card '{card_id}' is already frozen."
        if card.get("status") != "ACTIVE":
            return (f"Error: Debit card '{card_id}' cannot be frozen. Current status: {card.get('status')}. "
                    "Only ACTIVE cards can be frozen.")
        card.update(status="FROZEN", frozen_date=tables.today_str())
        return "\n".join([
            "Debit Card Frozen Successfully", f"Card ID: {card_id}", "Status: FROZEN",
            f"Frozen Date: {tables.today_str()}", "", "While frozen:", "- All new purchase transactions will be declined",
            "- Recurring payments and subscriptions will be declined",
            "- Pending transactions already authorized may still process", "",
            "To unfreeze, the customer can call customer service or use the mobile app.",
            "If the card is confirmed lost or stolen, recommend closing the card permanently instead."])

    @discoverable(ToolKind.WRITE)
    def unfreeze_debit_card_3893(self, card_id: str) -> str:
        """Unfreeze a previously frozen debit card.

        Args:
            card_id (string): The debit card ID to unfreeze

        Returns:
            Debit card unfrozen successfully.
        """
        if not card_id:
            return "Error: Missing required parameter: card_id."
        card = self._card(card_id)
        if card is None:
            return f"Error: Debit card '{card_id}' not found."
        if card.get("status") == "ACTIVE":
            return f"Error: Debit card '{card_id}' is already active."
        if card.get("status") != "FROZEN":
            return (f"Error: Debit card '{card_id}' cannot be unfrozen. Current status: {card.get('status')}. "
                    "Only FROZEN cards can be unfrozen.")
        account_id = card.get("account_id")
        if account_id and account_id in self.db.accounts.data and \
                self.db.accounts.data[account_id].get("status") != "OPEN":
            return f"Error: The linked checking account '{account_id}' is no longer open. Card cannot be unfrozen."
        card.update(status="ACTIVE", unfrozen_date=tables.today_str())
        return "\n".join(["Debit Card Unfrozen Successfully", f"Card ID: {card_id}", "Status: ACTIVE",
                          f"Unfrozen Date: {tables.today_str()}", "",
                          "The card is now active and ready to use immediately.",
                          "All transactions will process normally."])

    @discoverable(ToolKind.WRITE)
    def clear_debit_card_fraud_alert_4892(self, card_id: str, reason: str) -> str:
        """Clear a fraud alert or velocity block on a debit card.

        Args:
            card_id (string): The debit card ID to clear the alert/block for
            reason (string): Reason for clearing: 'customer_verified' (for fraud alerts after customer verification) or 'velocity_clear' (for velocity blocks after identity verification)

        Returns:
            Fraud alert/velocity block cleared successfully.
        """
        if not card_id:
            return "Error: Missing required parameter: card_id."
        if not reason:
            return "Error: Missing required parameter: reason."
        valid = ["customer_verified", "velocity_clear"]
        if reason not in valid:
            return f"Error: Invalid reason '{reason}'. Must be one of: {', '.join(valid)}"
        card = self._card(card_id)
        if card is None:
            return f"Error: Debit card '{card_id}' not found."
        today = tables.today_str()
        if reason == "velocity_clear":
            if not card.get("velocity_blocked", False):
                return f"Error: Debit card '{card_id}' does not have an active velocity block."
            card.update(velocity_blocked=False, velocity_cleared_date=today)
            return "\n".join(["Velocity Block Cleared Successfully", f"Card ID: {card_id}", f"Cleared Date: {today}", "",
                              "The card is now unblocked and ready for normal use.",
                              "The velocity monitoring will continue - if the same unusual patterns recur,",
                              "the card may be blocked again automatically."])
        if not card.get("fraud_alert_active", False):
            return f"Error: Debit card '{card_id}' does not have an active fraud alert."
        if card.get("alert_source") == "bank_initiated":
            return ("Error: BANK_INITIATED_ALERT - This fraud alert was initiated by the bank's fraud detection system "
                    "and cannot be cleared by customer service agents. Please transfer the customer to the security "
                    "team using transfer_to_human_agents.")
        card.update(fraud_alert_active=False, alert_source=None, fraud_alert_cleared_date=today)
        return "\n".join(["Fraud Alert Cleared Successfully", f"Card ID: {card_id}", f"Cleared Date: {today}", "",
                          "The fraud alert has been removed from the card.", "All transactions will process normally.",
                          "", "Remind the customer to review recent transactions and report any unauthorized charges."])

    @discoverable(ToolKind.WRITE)
    def reset_debit_card_pin_6284(self, card_id: str, last_4_digits: str, new_pin: str) -> str:
        """Reset a debit card PIN when the customer has forgotten it.

        Args:
            card_id (string): The debit card ID to reset PIN for
            last_4_digits (string): Last 4 digits of the card number (for verification)
            new_pin (string): The new 4-digit PIN chosen by the customer

        Returns:
            Debit card PIN reset successfully.
        """
        if not all([card_id, last_4_digits, new_pin]):
            return "Error: Missing required parameters. Required: card_id, last_4_digits, new_pin."
        if not last_4_digits.isdigit() or len(last_4_digits) != 4:
            return "Error: Last 4 digits must be exactly 4 digits."
        if problem := pin_problem(new_pin):
            return f"Error: {problem}"
        card = self._card(card_id)
        if card is None:
            return f"Error: Debit card '{card_id}' not found."
        if card.get("last_4_digits") != last_4_digits:
            return "Error: Card verification failed. The last 4 digits do not match our records."
        if card.get("status") != "ACTIVE":
            return (f"Error: Cannot reset PIN. Card status is {card.get('status')}. Only ACTIVE cards can have their "
                    "PIN reset.")
        card.update(pin_last_changed=tables.today_str(), pin_locked=False, pin_attempts_remaining=3)
        return "\n".join(["Debit Card PIN Reset Successfully", f"Card ID: {card_id}",
                          f"PIN Changed: {tables.today_str()}", "", "The new PIN is effective immediately.",
                          "Your card has been unlocked and is ready to use.",
                          "Customer can use the new PIN for ATM withdrawals and point-of-sale transactions.", "",
                          "Security reminder: Never share your PIN with anyone."])

    @discoverable(ToolKind.WRITE)
    def change_debit_card_pin_6285(self, card_id: str, current_pin: str, new_pin: str) -> str:
        """Change a debit card PIN when the customer knows their current PIN.

        Args:
            card_id (string): The debit card ID to change PIN for
            current_pin (string): The customer's current 4-digit PIN
            new_pin (string): The new 4-digit PIN chosen by the customer

        Returns:
            Debit card PIN changed successfully.
        """
        if not all([card_id, current_pin, new_pin]):
            return "Error: Missing required parameters. Required: card_id, current_pin, new_pin."
        if not current_pin.isdigit() or len(current_pin) != 4:
            return "Error: Current PIN must be exactly 4 digits."
        if problem := pin_problem(new_pin):
            return f"Error: {problem}"
        if current_pin == new_pin:
            return "Error: New PIN must be different from current PIN."
        card = self._card(card_id)
        if card is None:
            return f"Error: Debit card '{card_id}' not found."
        if card.get("status") != "ACTIVE":
            return (f"Error: Cannot change PIN. Card status is {card.get('status')}. Only ACTIVE cards can have their "
                    "PIN changed.")
        card["pin_last_changed"] = tables.today_str()
        return "\n".join(["Debit Card PIN Changed Successfully", f"Card ID: {card_id}",
                          f"PIN Changed: {tables.today_str()}", "", "The new PIN is effective immediately.",
                          "Customer can use the new PIN for ATM withdrawals and point-of-sale transactions.", "",
                          "Security reminder: Never share your PIN with anyone."])

    @discoverable(ToolKind.READ)
    def get_debit_cards_by_account_id_7823(self, account_id: str) -> str:
        """Retrieve all debit cards associated with a checking account. Returns card details including status, issue reason, and expiration date.

        Args:
            account_id (string): The checking account ID to retrieve debit cards for

        Returns:
            Debit cards retrieved successfully.
        """
        if not account_id:
            return "Error: Missing required parameter 'account_id'."
        account = self.db.accounts.data.get(account_id)
        if account is None:
            return f"Error: Account '{account_id}' not found."
        if account.get("class", "").lower() not in ["checking", "business_checking"]:
            return (f"Error: Account '{account_id}' is not a checking account. Debit cards are only available for "
                    "checking accounts.")
        cards = [_shown_card(card_id, card) for card_id, card in self.db.debit_cards.data.items()
                 if card.get("account_id") == account_id]
        if not cards:
            return f"No debit cards found for account '{account_id}'."
        cards.sort(key=lambda c: c.get("date_issued") or "", reverse=True)
        return json.dumps(cards, indent=2)

    @discoverable(ToolKind.WRITE)
    def request_temporary_debit_card_limit_increase_8374(self, card_id: str, limit_type: str, new_limit: int) -> str:
        """Request a temporary 24-hour increase to a debit card's daily ATM or purchase limit.

        Args:
            card_id (string): The debit card ID to increase limits for
            limit_type (string): Type of limit to increase: 'atm' for daily ATM withdrawal limit, 'purchase' for daily purchase limit
            new_limit (integer): The requested new temporary limit amount in dollars

        Returns:
            Temporary limit increase granted successfully.
        """
        if error := _limit_request_error(card_id, limit_type, new_limit):
            return error
        new_limit = int(float(new_limit))
        card = self._card(card_id)
        if card is None:
            return f"Error: Debit card '{card_id}' not found."
        if card.get("status") != "ACTIVE":
            return (f"Error: Debit card '{card_id}' is not active. Current status: {card.get('status')}. Only ACTIVE "
                    "cards can have limit increases.")
        account_id = card.get("account_id")
        if not account_id or account_id not in self.db.accounts.data:
            return f"Error: Could not find linked account for debit card '{card_id}'."
        account = self.db.accounts.data[account_id]
        current, name, error = _current_limit(card, account, account_id, limit_type)
        if error:
            return error
        maximum = int(current * 1.5)
        if new_limit > maximum:
            return (f"Error: Requested limit ${new_limit} exceeds the maximum allowed temporary increase. Maximum "
                    f"temporary limit is ${maximum} (150% of current ${current} limit).")
        if new_limit <= current:
            return f"Error: Requested limit ${new_limit} is not higher than the current limit of ${current}."
        card["daily_atm_limit" if limit_type == "atm" else "daily_purchase_limit"] = new_limit
        card[f"temporary_{limit_type}_limit_increase"] = True
        card[f"original_{limit_type}_limit"] = current
        card[f"temporary_{limit_type}_limit_expires"] = tables.today_str()
        return "\n".join([
            f"Temporary {name} Increase Granted Successfully", f"Card ID: {card_id}", f"Previous Limit: ${current}",
            f"New Temporary Limit: ${new_limit}", f"Increase Amount: ${new_limit - current}", "",
            "Important Information:", "- This temporary increase expires in 24 hours",
            f"- After expiration, the limit will revert to ${current}",
            "- Only one temporary increase is allowed per 24-hour period", "",
            "Note: If the customer is at a third-party (non-Rho-Bank) ATM, that ATM may have its own",
            "per-transaction or daily limits that Rho-Bank cannot override. The customer may need to",
            "use a Rho-Bank ATM or make multiple smaller withdrawals at third-party ATMs."])


def _shown_card(card_id: str, card: dict) -> dict:
    """tau2's card listing: the id first, `last_4_digits` as `card_number_last_4`, the issue date as `date_issued`."""
    info = {"card_id": card_id, **card}
    if "last_4_digits" in info and "card_number_last_4" not in info:
        info["card_number_last_4"] = info.pop("last_4_digits")
    if "issue_date" in info and "date_issued" not in info:
        info["date_issued"] = info.pop("issue_date")
    elif "created_date" in info and "date_issued" not in info:
        info["date_issued"] = info.pop("created_date")
    return info


def _limit_request_error(card_id: str, limit_type: str, new_limit: Any) -> str | None:
    if not card_id:
        return "Error: Missing required parameter: card_id."
    if not limit_type:
        return "Error: Missing required parameter: limit_type."
    if limit_type not in ["atm", "purchase"]:
        return f"Error: Invalid limit_type '{limit_type}'. Must be 'atm' or 'purchase'."
    if new_limit is None:
        return "Error: Missing required parameter: new_limit."
    try:
        value = float(new_limit)
    except (ValueError, TypeError):
        return f"Error: new_limit must be an integer, got '{new_limit}'."
    if not value.is_integer():
        return f"Error: new_limit must be an integer, got '{value}'."
    if int(value) <= 0:
        return "Error: new_limit must be a positive amount."
    return None


def _current_limit(card: dict, account: dict, account_id: str, limit_type: str) -> tuple[Any, str, str | None]:
    """(current limit, its name, error): tau2's account checks (open, 60+ days old) and limit look-up."""
    if account.get("status") != "OPEN":
        return None, "", (f"Error: The linked account '{account_id}' is not in good standing. Account status: "
                          f"{account.get('status')}.")
    if account.get("date_opened"):
        try:
            age = (datetime.strptime(tables.today_str(), "%m/%d/%Y")
                   - datetime.strptime(account["date_opened"], "%m/%d/%Y")).days
            if age < 60:
                return None, "", ("Error: Account must be at least 60 days old for a temporary limit increase. "
                                  f"Account age: {age} days.")
        except ValueError:
            pass
    name = "Daily ATM Withdrawal Limit" if limit_type == "atm" else "Daily Purchase Limit"
    current = card.get("daily_atm_limit" if limit_type == "atm" else "daily_purchase_limit")
    if limit_type == "atm" and current is None:
        level = account.get("level", "").lower()
        if "light green" in level:
            return None, name, (
                "Error: Light Green Account (teen checking) cards have policy-based limits that cannot be modified. "
                "The daily ATM withdrawal limit of $150 is fixed by account policy for safety reasons. The customer "
                "may request the parent/guardian to withdraw cash from their own account if needed.")
        current = DEFAULT_ATM_LIMITS.get(level)
        if current is None:
            return None, name, (f"Error: Could not determine the default ATM limit for account type "
                                f"'{account.get('level')}'. Please verify the account type.")
    if current is None:
        return None, name, (f"Error: The card does not have a {name.lower()} configured. This may be a restricted "
                            "account type where limits are set by account policy and cannot be modified.")
    return current, name, None


named_as("KnowledgeTools", DebitCardTools)
