"""The agent's discoverable tools for credit-card payments and credit-limit increases (tau2-bench
`banking_knowledge/tools.py`): pay from checking, payment history, and submit / approve / deny / list credit-limit
increase requests, with tau2's eligibility checks and texts.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.card_tools import DENIAL_REASONS, history, money
from turnforge.envs.service.banking.discoverable import discoverable, named_as
from turnforge.envs.service.toolkit import ToolKind


def cli_request_id(account_id: str, user_id: str, amount: float) -> str:
    return "cli_" + tables.hex_id(f"cli_request:{account_id}:{user_id}:{amount:.2f}", 12)


def cli_ineligible(db: Any, account_id: str, user_id: str, account: dict) -> bool:
    """tau2's approval checks: a pending dispute of the user, a pending replacement of the card, or bad standing."""
    if any(d.get("user_id") == user_id and d.get("status") in ["SUBMITTED", "UNDER_REVIEW", "PENDING"]
           for d in db.transaction_disputes.data.values()):
        return True
    if any(o.get("credit_card_account_id") == account_id and o.get("status") in ["PENDING", "PROCESSING", "SHIPPED"]
           for o in db.credit_card_orders.data.values()):
        return True
    return account.get("account_status", "").upper() in ["PAST_DUE", "DELINQUENT", "COLLECTIONS", "CLOSED"]


class CreditLimitTools:
    """Discoverable payment and credit-limit tools over `self.db`."""

    db: Any

    def _own_card(self, account_id: str, user_id: str) -> tuple[dict | None, str | None]:
        account = self.db.credit_card_accounts.data.get(account_id)
        if account is None:
            return None, f"Error: Credit card account '{account_id}' not found."
        if account.get("user_id") != user_id:
            return None, f"Error: Credit card account '{account_id}' does not belong to user '{user_id}'."
        return account, None

    @discoverable(ToolKind.WRITE)
    def pay_credit_card_from_checking_9182(self, user_id: str, checking_account_id: str, credit_card_account_id: str,
                                           amount: float) -> str:
        """Pay off a credit card balance using funds from the customer's Rho-Bank checking account. This deducts the specified amount from the checking account and reduces the credit card balance by the same amount.

        Args:
            user_id (string): The customer's unique identifier in the system
            checking_account_id (string): The ID of the Rho-Bank checking account to debit funds from
            credit_card_account_id (string): The ID of the credit card account to apply the payment to
            amount (number): The payment amount in dollars. Must be a positive number.

        Returns:
            Credit card payment processed successfully.
        """
        if not user_id or not checking_account_id or not credit_card_account_id or amount is None:
            return ("Error: Missing required parameters (user_id, checking_account_id, credit_card_account_id, "
                    "amount).")
        try:
            amount = float(amount)
            if amount <= 0:
                return "Error: Payment amount must be a positive number."
        except (ValueError, TypeError):
            return "Error: Invalid payment amount. Must be a positive number."
        checking = self.db.accounts.data.get(checking_account_id)
        if checking is None:
            return f"Error: Checking account '{checking_account_id}' not found."
        if checking.get("user_id") != user_id:
            return f"Error: Checking account '{checking_account_id}' does not belong to user '{user_id}'."
        if checking.get("class") != "checking":
            return f"Error: Account '{checking_account_id}' is not a checking account."
        available = tables.account_balance(checking)
        if amount > available:
            return (f"Error: Insufficient funds in checking account. Available balance: ${available:.2f}, "
                    f"requested payment: ${amount:.2f}.")
        card, error = self._own_card(credit_card_account_id, user_id)
        if error:
            return error
        owed = money(card.get("current_balance", "$0.00"))
        if amount > owed:
            return (f"Error: Payment amount (${amount:.2f}) exceeds credit card balance (${owed:.2f}). "
                    "Please specify an amount up to the outstanding balance.")
        checking["current_holdings"] = f"{available - amount:.2f}"
        card["current_balance"] = f"${owed - amount:.2f}"
        return (f"Payment processed successfully!\n  - Payment Amount: ${amount:.2f}\n"
                f"  - From Checking Account: {checking_account_id}\n  - To Credit Card Account: {credit_card_account_id}\n"
                f"  - New Checking Balance: ${available - amount:.2f}\n  - New Credit Card Balance: ${owed - amount:.2f}\n"
                "The payment has been applied immediately.")

    @discoverable(ToolKind.WRITE)
    def submit_credit_limit_increase_request_7392(self, credit_card_account_id: str, user_id: str,
                                                  requested_increase_amount: int) -> str:
        """Submit a credit limit increase request for a customer's credit card.

        Args:
            credit_card_account_id (string): The credit card account ID to request increase for
            user_id (string): The customer's unique identifier in the system
            requested_increase_amount (integer): The dollar amount by which to increase the credit limit (e.g., 2500 for $2,500)

        Returns:
            Credit limit increase request submitted successfully.
        """
        if not credit_card_account_id or not user_id or requested_increase_amount is None:
            return "Error: Missing required parameters."
        try:
            amount = float(requested_increase_amount)
        except (TypeError, ValueError):
            return "Error: Invalid requested_increase_amount. Must be a whole number."
        if not amount.is_integer():
            return "Error: Invalid requested_increase_amount. Must be a whole number of dollars."
        amount = int(amount)
        if amount <= 0:
            return "Error: Requested increase amount must be positive."
        _, error = self._own_card(credit_card_account_id, user_id)
        if error:
            return error
        request, today = cli_request_id(credit_card_account_id, user_id, amount), tables.today_str()
        record = {"request_id": request, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
                  "requested_increase_amount": amount, "submitted_at": today, "status": "PENDING"}
        if not tables.add(self.db, "credit_limit_increase_requests", request, record):
            return "Error: A similar request may already exist."
        return (f"Credit limit increase request submitted successfully.\n\n"
                f"Executed: submit_credit_limit_increase_request_7392\n  - Request ID: {request}\n"
                f"  - Account: {credit_card_account_id}\n  - Requested Increase: ${amount:,}\n  - Status: PENDING")

    @discoverable(ToolKind.READ)
    def get_credit_limit_increase_history_4829(self, credit_card_account_id: str) -> str:
        """Retrieve the credit limit increase request history for a specific credit card account. Returns all previous CLI requests including dates, amounts, and statuses.

        Args:
            credit_card_account_id (string): The credit card account ID to check for CLI history

        Returns:
            Credit limit increase history retrieved.
        """
        if not credit_card_account_id:
            return "Error: Missing required parameter: credit_card_account_id"
        return history(self.db, "Credit limit increase history retrieved.", "get_credit_limit_increase_history_4829",
                       f"Credit limit increase history for account {credit_card_account_id}:",
                       "credit_limit_increase_requests", "credit_card_account_id", credit_card_account_id,
                       "\nNo credit limit increase requests found for this account.")

    @discoverable(ToolKind.READ)
    def get_payment_history_6183(self, credit_card_account_id: str, months: int) -> str:
        """Retrieve payment history for a credit card account.

        Args:
            credit_card_account_id (string): The credit card account ID to check payment history for
            months (integer): Number of months of payment history to retrieve

        Returns:
            Payment history retrieved.
        """
        if not credit_card_account_id or months is None:
            return "Error: Missing required parameters (credit_card_account_id, months)."
        try:
            months = int(months)
            if months <= 0:
                return "Error: months must be a positive integer."
        except (ValueError, TypeError):
            return "Error: Invalid months value. Must be a positive integer."
        payments = [p for p in self.db.payment_history.data.values()
                    if p.get("credit_card_account_id") == credit_card_account_id]
        if not payments:
            return f"No payment history found for account '{credit_card_account_id}'."
        payments = sorted(payments, key=lambda p: p.get("payment_date") or "", reverse=True)[:months]
        on_time = 0
        for payment in payments:
            if payment.get("status") != "ON_TIME":
                break
            on_time += 1
        parts = [f"Payment history for account '{credit_card_account_id}' (last {months} months):",
                 f"Consecutive on-time payments: {on_time}"]
        parts += [f"\n  - Payment Date: {p.get('payment_date')}\n    Amount: {p.get('amount')}\n"
                  f"    Status: {p.get('status')}" for p in payments]
        return "\n".join(parts)

    @discoverable(ToolKind.WRITE)
    def approve_credit_limit_increase_5847(self, credit_card_account_id: str, user_id: str,
                                           new_credit_limit: int) -> str:
        """Approve and apply a credit limit increase for a customer's credit card.

        Args:
            credit_card_account_id (string): The credit card account ID
            user_id (string): The customer's unique identifier in the system
            new_credit_limit (integer): The new total credit limit in dollars (e.g., 7500 for $7,500)

        Returns:
            Credit limit increase approved and applied successfully.
        """
        if not credit_card_account_id or not user_id or new_credit_limit is None:
            return "Error: Missing required parameters."
        account, error = self._own_card(credit_card_account_id, user_id)
        if error:
            return error
        if cli_ineligible(self.db, credit_card_account_id, user_id, account):
            return "Error: Credit limit increase request cannot be approved at this time."
        current, new = money(account.get("credit_limit", "$0.00")), float(new_credit_limit)
        account["credit_limit"] = f"${new:.2f}"
        today, request = tables.today_str(), cli_request_id(credit_card_account_id, user_id, new - current)
        tables.add(self.db, "credit_limit_increase_requests", request, {
            "request_id": request, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
            "previous_limit": f"${current:.2f}", "new_limit": f"${new:.2f}", "increase_amount": f"${new - current:.2f}",
            "decision_date": today, "status": "APPROVED"})
        return (f"Credit limit increase approved!\n  - Account: {credit_card_account_id}\n"
                f"  - Previous Limit: ${current:.2f}\n  - New Limit: ${new:.2f}\n  - Increase: ${new - current:.2f}\n"
                f"  - Effective Date: {today}\nThe customer will receive a confirmation email.")

    @discoverable(ToolKind.WRITE)
    def deny_credit_limit_increase_5848(self, credit_card_account_id: str, user_id: str, denial_reason: str) -> str:
        """Deny a credit limit increase request for a customer's credit card.

        Args:
            credit_card_account_id (string): The credit card account ID
            user_id (string): The customer's unique identifier in the system
            denial_reason (string): The reason for denying the request. Must be one of: 'insufficient_account_age', 'cooldown_period_active', 'pending_disputes', 'pending_replacement_card', 'past_due_balance', 'high_utilization', 'insufficient_payment_history', 'requested_amount_exceeds_limit', 'other'

        Returns:
            Credit limit increase request denied.
        """
        if not credit_card_account_id or not user_id or not denial_reason:
            return "Error: Missing required parameters."
        if denial_reason not in DENIAL_REASONS:
            return f"Error: Invalid denial_reason. Must be one of: {', '.join(DENIAL_REASONS)}"
        if credit_card_account_id not in self.db.credit_card_accounts.data:
            return f"Error: Credit card account '{credit_card_account_id}' not found."
        today, request = tables.today_str(), cli_request_id(credit_card_account_id, user_id, 0.0)
        tables.add(self.db, "credit_limit_increase_requests", request, {
            "request_id": request, "credit_card_account_id": credit_card_account_id, "user_id": user_id,
            "denial_reason": denial_reason, "decision_date": today, "status": "DENIED"})
        return (f"Credit limit increase request denied.\n  - Account: {credit_card_account_id}\n"
                f"  - Denial Reason: {denial_reason}\n  - Date: {today}\n"
                "The customer will receive a notification explaining the denial.")


named_as("KnowledgeTools", CreditLimitTools)
