"""The agent's discoverable credit-card tools (tau2-bench `banking_knowledge/tools.py`): transaction rewards and
disputes, replacement cards, closures, statement credits, account flags, payments and credit-limit increases.
Docstrings, checks, records and texts are tau2's (the docstring is what `unlock_discoverable_agent_tool` shows).
"""

from __future__ import annotations

import json
from typing import Any

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.discoverable import discoverable, named_as
from turnforge.envs.service.toolkit import ToolKind


def executed(name: str, args: dict) -> str:
    """tau2's "Executed: NAME / Arguments: JSON" block."""
    return f"Executed: {name}\nArguments: {json.dumps(args, indent=2)}\n"


def history(db: Any, header: str, name: str, title: str, table: str, field: str, value: str, none: str) -> str:
    """tau2's look-up answers: a header, the tool, a title, then the query's listing or `none`."""
    result = tables.query_field(db, table, field, value)
    return "\n".join([header, "", f"Executed: {name}", title, result if tables.found(result) else none])


def one_of(value: Any, valid: list[str], field: str) -> str | None:
    return None if value in valid else f"Error: Invalid {field}. Must be one of: {valid}"


def titled(value: str) -> str:
    return value.replace("_", " ").title()


def money(value: Any) -> float:
    """A "$1,234.50" field as tau2 reads it (0 when unreadable)."""
    try:
        return float(str(value).replace("$", "").replace(",", ""))
    except (ValueError, TypeError):
        return 0.0


def cc_missing(db: Any, account_id: str) -> str | None:
    if tables.found(tables.query_field(db, "credit_card_accounts", "account_id", account_id)):
        return None
    return f"Error: Credit card account '{account_id}' not found."


DISPUTE_REASONS = ["unauthorized_fraudulent_charge", "duplicate_charge", "incorrect_amount",
                   "goods_services_not_received", "goods_services_not_as_described",
                   "canceled_subscription_still_charging", "refund_never_processed"]
CREDIT_REASONS = ["goodwill_adjustment", "promotional_credit", "annual_fee_reversal", "late_fee_reversal",
                  "interest_charge_reversal", "dispute_resolution", "price_match", "retention_offer",
                  "error_correction", "other"]
CLOSURE_REASONS = ["annual_fee", "not_using_card", "found_better_card", "unhappy_with_rewards",
                   "simplifying_finances", "negative_experience", "other"]
DENIAL_REASONS = ["insufficient_account_age", "cooldown_period_active", "pending_disputes", "pending_replacement_card",
                  "past_due_balance", "high_utilization", "insufficient_payment_history",
                  "requested_amount_exceeds_limit", "other"]


class CreditCardTools:
    """Discoverable credit-card tools over `self.db`."""

    db: Any

    @discoverable(ToolKind.WRITE)
    def example_agent_tool_0000(self) -> str:
        """An example agent discoverable tool placeholder.

        Returns:
            Example tool executed successfully.
        """
        return "Example tool executed successfully."

    @discoverable(ToolKind.WRITE)
    def update_transaction_rewards_3847(self, transaction_id: str, new_rewards_earned: str) -> str:
        """Update the rewards_earned field on a credit card transaction.

        Args:
            transaction_id (string): The unique identifier for the transaction to update
            new_rewards_earned (string): The corrected rewards value (e.g., '6300 points')

        Returns:
            Transaction rewards updated successfully.
        """
        if not transaction_id or not new_rewards_earned:
            return "Error: Missing required parameters."
        if tables.update(self.db, "credit_card_transaction_history", transaction_id,
                         {"rewards_earned": new_rewards_earned}) is None:
            return f"Error: Transaction '{transaction_id}' not found."
        args = {"transaction_id": transaction_id, "new_rewards_earned": new_rewards_earned}
        return ("Transaction rewards updated successfully.\n\n" + executed("update_transaction_rewards_3847", args)
                + f"Transaction updated:\n  - Transaction ID: {transaction_id}\n  - New Rewards: {new_rewards_earned}")

    @discoverable(ToolKind.WRITE)
    def file_credit_card_transaction_dispute_4829(
        self, transaction_id: str, card_action: str, card_last_4_digits: str, full_name: str, user_id: str,
        phone: str, email: str, address: str, contacted_merchant: bool, purchase_date: str, issue_noticed_date: str,
        dispute_reason: str, resolution_requested: str, eligible_for_provisional_credit: bool,
        partial_refund_amount: float | None = None,
    ) -> str:
        """File a formal dispute for a credit card transaction.

        Args:
            transaction_id (string): The unique identifier for the transaction being disputed
            card_action (string): Flag indicating the card's status. Must be one of: 'keep_active' (card remains active, dispute only), 'cancel_and_reissue' (card is being cancelled and replaced). This is for record-keeping only and does NOT order a replacement card.
            card_last_4_digits (string): Last 4 digits of the credit card number
            full_name (string): Full legal name of the cardholder
            user_id (string): The user's unique identifier in the system
            phone (string): Contact phone number
            email (string): Contact email address
            address (string): Contact mailing address
            contacted_merchant (boolean): Whether the user attempted to resolve the issue with the merchant first
            purchase_date (string): Date when the purchase was made, format MM/DD/YYYY
            issue_noticed_date (string): Date when the user noticed the issue, format MM/DD/YYYY
            dispute_reason (string): Reason for the dispute. Must be one of: 'unauthorized_fraudulent_charge', 'duplicate_charge', 'incorrect_amount', 'goods_services_not_received', 'goods_services_not_as_described', 'canceled_subscription_still_charging', 'refund_never_processed'
            resolution_requested (string): Resolution being requested. Must be one of: 'full_refund', 'partial_refund'
            eligible_for_provisional_credit (boolean): Whether the user is eligible for provisional credit
            partial_refund_amount (number, optional): Amount requested for partial refund (required only if resolution_requested is 'partial_refund')

        Returns:
            Credit card transaction dispute filed successfully. A case has been opened and will be reviewed within 10 business days.
        """
        if not transaction_id or not user_id:
            return "Error: Missing required parameters."
        error = (one_of(card_action, ["keep_active", "cancel_and_reissue"], "card_action")
                 or one_of(dispute_reason, DISPUTE_REASONS, "dispute_reason")
                 or one_of(resolution_requested, ["full_refund", "partial_refund"], "resolution_requested"))
        if error:
            return error
        if resolution_requested == "partial_refund" and partial_refund_amount is None:
            return "Error: partial_refund_amount is required when resolution_requested is 'partial_refund'."
        dispute = tables.dispute_id(user_id, transaction_id)
        record = {
            "dispute_id": dispute, "transaction_id": transaction_id, "user_id": user_id, "card_action": card_action,
            "card_last_4_digits": card_last_4_digits, "full_name": full_name, "phone": phone, "email": email,
            "address": address, "contacted_merchant": contacted_merchant, "purchase_date": purchase_date,
            "issue_noticed_date": issue_noticed_date, "dispute_reason": dispute_reason,
            "resolution_requested": resolution_requested, "partial_refund_amount": partial_refund_amount,
            "eligible_for_provisional_credit": eligible_for_provisional_credit,
            "provisional_credit_given": eligible_for_provisional_credit, "submitted_at": tables.today_str(),
            "status": "SUBMITTED",
        }
        if not tables.add(self.db, "transaction_disputes", dispute, record):
            return "Error: Dispute may have already been filed for this transaction."
        parts = ["Credit card transaction dispute filed successfully. A case has been opened and will be reviewed "
                 "within 10 business days.", "", "Executed: file_credit_card_transaction_dispute_4829",
                 f"Dispute ID: {dispute}", f"Transaction: {transaction_id}", f"Reason: {titled(dispute_reason)}",
                 f"Resolution Requested: {titled(resolution_requested)}"]
        if partial_refund_amount:
            parts.append(f"Partial Refund Amount: ${partial_refund_amount:.2f}")
        parts.append("Provisional Credit: ELIGIBLE - Credit will be applied within 2 business days."
                     if eligible_for_provisional_credit else "Provisional Credit: Not eligible at this time.")
        return "\n".join(parts)

    @discoverable(ToolKind.WRITE)
    def order_replacement_credit_card_7291(self, credit_card_account_id: str, user_id: str, shipping_address: str,
                                           reason: str, expedited_shipping: bool = False) -> str:
        """Order a replacement credit card for a customer. The old card will be automatically cancelled when the replacement is ordered.

        Args:
            credit_card_account_id (string): The credit card account ID for the card being replaced
            user_id (string): The user's unique identifier in the system
            shipping_address (string): Full shipping address where the new card should be sent
            reason (string): Reason for replacement. Must be one of: 'fraud_suspected', 'lost', 'stolen', 'damaged', 'expired', 'other'
            expedited_shipping (boolean, optional): Whether to use expedited shipping (2-3 business days instead of 7-10)

        Returns:
            Replacement credit card order placed successfully. The old card has been cancelled for security.
        """
        if not credit_card_account_id or not user_id or not shipping_address or not reason:
            return ("Error: Missing required parameters (credit_card_account_id, user_id, shipping_address, "
                    "reason).")
        if error := one_of(reason, ["fraud_suspected", "lost", "stolen", "damaged", "expired", "other"], "reason"):
            return error
        if error := cc_missing(self.db, credit_card_account_id):
            return error
        order = "ccord_" + tables.hex_id(f"credit_card_order:{credit_card_account_id}:{user_id}:{reason}", 12)
        record = {"order_id": order, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
                  "shipping_address": shipping_address, "reason": reason, "expedited_shipping": expedited_shipping,
                  "order_date": tables.today_str(), "status": "ORDERED", "old_card_cancelled": True}
        if not tables.add(self.db, "credit_card_orders", order, record):
            return "Error: Order may have already been placed for this card replacement."
        account = self.db.credit_card_accounts.data.get(credit_card_account_id)
        if account is not None:
            account["status"] = "CLOSED"
            account["closed_date"] = tables.today_str()
        return "\n".join([
            f"Order ID: {order}", f"Card Account: {credit_card_account_id}", f"Reason: {titled(reason)}",
            f"Shipping Address: {shipping_address}",
            f"Shipping Method: {'Expedited' if expedited_shipping else 'Standard'}",
            f"Expected Delivery: {'2-3 business days' if expedited_shipping else '7-10 business days'}", "",
            "The old card has been cancelled for security. The new card will have the same account number but a new "
            "card number and CVV."])

    @discoverable(ToolKind.READ)
    def get_user_dispute_history_7291(self, user_id: str) -> str:
        """Retrieve a user's credit card transaction dispute history from the transaction_disputes table. Returns all credit card transaction disputes filed by the user, including dispute IDs, transaction IDs, dispute reasons, statuses, and submission dates.

        Args:
            user_id (string): The user's unique identifier in the system

        Returns:
            User transaction dispute history retrieved successfully.
        """
        if not user_id:
            return "Error: Missing required parameter: user_id"
        return history(self.db, "User transaction dispute history retrieved successfully.",
                       "get_user_dispute_history_7291", f"Transaction dispute history for user {user_id}:",
                       "transaction_disputes", "user_id", user_id, "\nNo transaction disputes found for this user.")

    @discoverable(ToolKind.READ)
    def get_pending_replacement_orders_5765(self, credit_card_account_id: str) -> str:
        """Check if a credit card account has any pending replacement card orders.

        Args:
            credit_card_account_id (string): The credit card account ID to check for pending replacement orders

        Returns:
            Pending replacement orders check completed.
        """
        if not credit_card_account_id:
            return "Error: Missing required parameter: credit_card_account_id"
        return history(self.db, "Pending replacement orders check completed.", "get_pending_replacement_orders_5765",
                       f"Replacement orders for credit card account {credit_card_account_id}:", "credit_card_orders",
                       "credit_card_account_id", credit_card_account_id,
                       "\nNo pending replacement orders found for this credit card account.")

    @discoverable(ToolKind.WRITE)
    def log_credit_card_closure_reason_4521(self, credit_card_account_id: str, user_id: str,
                                            closure_reason: str) -> str:
        """Log the reason why a customer wants to close their credit card account.

        Args:
            credit_card_account_id (string): The credit card account ID the customer wants to close
            user_id (string): The user's unique identifier in the system
            closure_reason (string): Reason for closure. Must be one of: 'annual_fee', 'not_using_card', 'found_better_card', 'unhappy_with_rewards', 'simplifying_finances', 'negative_experience', 'other'

        Returns:
            Closure reason logged successfully.
        """
        if not credit_card_account_id or not user_id or not closure_reason:
            return "Error: Missing required parameters."
        if error := one_of(closure_reason, CLOSURE_REASONS, "closure_reason"):
            return error
        record_id = "clsr_" + tables.hex_id(f"closure_reason:{credit_card_account_id}:{user_id}", 12)
        tables.add(self.db, "credit_card_closure_reasons", record_id, {
            "record_id": record_id, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
            "closure_reason": closure_reason, "logged_at": tables.today_str(), "status": "LOGGED"})
        args = {"credit_card_account_id": credit_card_account_id, "user_id": user_id, "closure_reason": closure_reason}
        return ("Closure reason logged successfully.\n\n" + executed("log_credit_card_closure_reason_4521", args)
                + f"Closure reason '{closure_reason}' logged for account {credit_card_account_id}.")

    @discoverable(ToolKind.READ)
    def get_closure_reason_history_8293(self, credit_card_account_id: str) -> str:
        """Retrieve the closure reason history for a specific credit card account.

        Args:
            credit_card_account_id (string): The credit card account ID to check for previous closure attempts

        Returns:
            Closure reason history retrieved successfully.
        """
        if not credit_card_account_id:
            return "Error: Missing required parameter: credit_card_account_id"
        return history(self.db, "Closure reason history retrieved successfully.", "get_closure_reason_history_8293",
                       f"Closure reason history for credit card account {credit_card_account_id}:",
                       "credit_card_closure_reasons", "credit_card_account_id", credit_card_account_id,
                       "\nNo closure reason records found for this credit card account.")

    @discoverable(ToolKind.WRITE)
    def apply_statement_credit_8472(self, user_id: str, credit_card_account_id: str, amount: float, reason: str) -> str:
        """Apply a statement credit to a customer's credit card account.

        Args:
            user_id (string): The user's unique identifier in the system
            credit_card_account_id (string): The credit card account ID to apply the credit to
            amount (number): The credit amount in dollars (e.g., 25.00 for a $25 credit)
            reason (string): Reason for the statement credit. Must be one of: 'goodwill_adjustment', 'promotional_credit', 'annual_fee_reversal', 'late_fee_reversal', 'interest_charge_reversal', 'dispute_resolution', 'price_match', 'retention_offer', 'error_correction', 'other'

        Returns:
            Statement credit applied successfully.
        """
        if not user_id or not credit_card_account_id or amount is None or not reason:
            return "Error: Missing required parameters (user_id, credit_card_account_id, amount, reason)."
        if amount <= 0:
            return "Error: Credit amount must be positive."
        if error := one_of(reason, CREDIT_REASONS, "reason") or cc_missing(self.db, credit_card_account_id):
            return error
        txn, today = tables.transaction_id(user_id, "STATEMENT_CREDIT", reason, amount, "Statement Credit"), \
            tables.today_str()
        record = {"transaction_id": txn, "user_id": user_id, "credit_card_account_id": credit_card_account_id,
                  "credit_card_type": "N/A", "merchant_name": "Rho-Bank Statement Credit",
                  "transaction_amount": f"-${amount:.2f}", "transaction_date": today, "category": "Statement Credit",
                  "status": "COMPLETED", "rewards_earned": "0 points", "credit_reason": reason}
        if not tables.add(self.db, "credit_card_transaction_history", txn, record):
            return f"Error: Failed to apply statement credit. Transaction ID '{txn}' may already exist."
        return (f"Statement credit applied successfully.\n\nExecuted: apply_statement_credit_8472\n"
                f"  - Transaction ID: {txn}\n  - User ID: {user_id}\n  - Account: {credit_card_account_id}\n"
                f"  - Credit Amount: ${amount:.2f}\n  - Reason: {titled(reason)}\n  - Date: {today}")

    @discoverable(ToolKind.WRITE)
    def apply_credit_card_account_flag_6147(self, credit_card_account_id: str, user_id: str, flag_type: str,
                                            expiration_date: str, reason: str) -> str:
        """Apply a flag to a customer's credit card account. Flags can include annual fee waivers, promotional APR rates, rewards bonuses, or other account-level modifiers. Each flag has an effective date and expiration date.

        Args:
            credit_card_account_id (string): The credit card account ID to apply the flag to
            user_id (string): The user's unique identifier in the system
            flag_type (string): Type of flag to apply. Must be one of: 'annual_fee_waived', 'promotional_apr', 'rewards_bonus', 'other'
            expiration_date (string): Date when the flag expires (MM/DD/YYYY format)
            reason (string): Reason for applying this flag. Must be one of: 'retention_offer', 'loyalty_benefit', 'promotional', 'error_correction', 'other'

        Returns:
            Account flag applied successfully.
        """
        if not credit_card_account_id or not user_id or not flag_type or not expiration_date or not reason:
            return ("Error: Missing required parameters (credit_card_account_id, user_id, flag_type, expiration_date, "
                    "reason).")
        error = (one_of(flag_type, ["annual_fee_waived", "promotional_apr", "rewards_bonus", "other"], "flag_type")
                 or one_of(reason, ["retention_offer", "loyalty_benefit", "promotional", "error_correction", "other"],
                           "reason")
                 or cc_missing(self.db, credit_card_account_id))
        if error:
            return error
        flag = "ccflag_" + tables.hex_id(f"account_flag:{credit_card_account_id}:{flag_type}:{expiration_date}", 12)
        today = tables.today_str()
        record = {"flag_id": flag, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
                  "flag_type": flag_type, "effective_date": today, "expiration_date": expiration_date,
                  "reason": reason, "applied_at": today, "status": "ACTIVE"}
        if not tables.add(self.db, "credit_card_account_flags", flag, record):
            return f"Error: Failed to apply account flag. Flag ID '{flag}' may already exist."
        return (f"Account flag applied successfully!\n  - Flag ID: {flag}\n  - Account: {credit_card_account_id}\n"
                f"  - User ID: {user_id}\n  - Flag Type: {titled(flag_type)}\n  - Effective Date: {today}\n"
                f"  - Expiration Date: {expiration_date}\n  - Reason: {titled(reason)}")

    @discoverable(ToolKind.WRITE)
    def close_credit_card_account_7834(self, credit_card_account_id: str, user_id: str) -> str:
        """Close a customer's credit card account permanently.

        Args:
            credit_card_account_id (string): The credit card account ID to close
            user_id (string): The user's unique identifier in the system

        Returns:
            Credit card account closed successfully.
        """
        if not credit_card_account_id or not user_id:
            return "Error: Missing required parameters (credit_card_account_id, user_id)."
        if error := cc_missing(self.db, credit_card_account_id):
            return error
        updates = {"status": "CLOSED", "closed_date": tables.today_str(), "closed_by": user_id}
        if tables.update(self.db, "credit_card_accounts", credit_card_account_id, updates) is None:
            return f"Error: Failed to close credit card account '{credit_card_account_id}'."
        args = {"credit_card_account_id": credit_card_account_id, "user_id": user_id}
        return ("Credit card account closed successfully.\n\n" + executed("close_credit_card_account_7834", args)
                + f"Account {credit_card_account_id} has been closed.")


named_as("KnowledgeTools", CreditCardTools)
