"""The agent's discoverable bank-account tools (tau2-bench `banking_knowledge/tools.py`): open and close accounts
(tau2's eligibility rules and early-closure fees), list a user's accounts and an account's transactions, move
funds, credit checking / savings accounts and report interest discrepancies.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.discoverable import discoverable, named_as
from turnforge.envs.service.toolkit import ToolKind

# tau2's early-closure fee ($) and window (days) per account level, personal checking then savings
EARLY_CLOSURE = {
    "checking": {"Light Blue Account": (15, 30), "Light Green Account": (15, 30), "Green Fee-Free Account": (15, 30),
                 "Blue Account": (25, 60), "Green Account": (25, 60), "Evergreen Account": (50, 90),
                 "Bluest Account": (100, 180)},
    "savings": {"Bronze Account": (20, 60), "Silver Account": (35, 90), "Silver Plus Account": (35, 90),
                "Gold Account": (75, 180), "Gold Plus Account": (75, 180), "Gold Years Account": (75, 180),
                "Platinum Account": (150, 270), "Platinum Plus Account": (150, 270),
                "Diamond Elite Account": (150, 270)},
}
NOT_ELIGIBLE = "Error: Account eligibility requirements not met."
OPEN = ("OPEN", "ACTIVE")


def age_days(account: dict) -> int:
    """Days since `date_opened` (MM/DD/YYYY) at tau2's fixed now; 0 when unreadable."""
    try:
        return (tables.NOW - datetime.strptime(account.get("date_opened", ""), "%m/%d/%Y")).days
    except ValueError:
        return 0


def kind_of(account: dict) -> str:
    return account.get("account_type", account.get("class", ""))


def eligibility_error(accounts: list[dict], account_type: str) -> str | None:
    """tau2's rules: savings needs a personal checking open 14+ days; business checking no closed account and an open
    personal checking; business savings no negative balance and a business checking open 30+ days."""
    personal = [a for a in accounts if kind_of(a) in ["checking", "personal_checking"] and a.get("status", "") in OPEN]
    if account_type == "savings" and not any(age_days(a) >= 14 for a in personal):
        return NOT_ELIGIBLE
    if account_type == "business_checking" and (any(a.get("status") == "CLOSED" for a in accounts) or not personal):
        return NOT_ELIGIBLE
    if account_type == "business_savings":
        if any(tables.account_balance(a) < 0 for a in accounts):
            return NOT_ELIGIBLE
        if not any(kind_of(a) == "business_checking" and a.get("status", "") in OPEN and age_days(a) >= 30
                   for a in accounts):
            return NOT_ELIGIBLE
    return None


def txn_date(item: tuple[str, dict]) -> datetime:
    text = str(item[1].get("date", ""))
    for fmt in ("%m/%d/%Y %H:%M:%S", "%m/%d/%Y"):
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            continue
    return datetime.min


class AccountTools:
    """Discoverable bank-account tools over `self.db`."""

    db: Any

    @discoverable(ToolKind.WRITE)
    def open_bank_account_4821(self, user_id: str, account_type: str, account_class: str) -> str:
        """Open a new bank account for a customer.

        Args:
            user_id (string): The customer's unique identifier in the system
            account_type (string): Type of account to open. Must be one of: 'checking' (personal checking), 'savings' (personal savings), 'business_checking', 'business_savings'
            account_class (string): The full official account class name

        Returns:
            Bank account opened successfully.
        """
        if not user_id or not account_type or not account_class:
            return "Error: Missing required parameters."
        valid = ["checking", "savings", "business_checking", "business_savings"]
        if account_type not in valid:
            return f"Error: Invalid account_type. Must be one of: {valid}"
        owned = [a for a in self.db.accounts.data.values() if a.get("user_id") == user_id]
        if error := eligibility_error(owned, account_type):
            return error
        account, today = tables.hex_id(f"account:{user_id}:{account_type}:{account_class}"), tables.today_str()
        record = {"account_id": account, "user_id": user_id, "account_type": account_type,
                  "account_class": account_class, "current_holdings": "0.00", "status": "OPEN", "date_opened": today}
        if not tables.add(self.db, "accounts", account, record):
            return f"Failed to open account: Account ID '{account}' may already exist."
        return (f"Bank account opened successfully!\n  - Account ID: {account}\n  - User ID: {user_id}\n"
                f"  - Account Type: {account_type}\n  - Account Class: {account_class}\n  - Status: OPEN\n"
                f"  - Initial Balance: $0.00\n  - Date Opened: {today}")

    @discoverable(ToolKind.WRITE)
    def close_bank_account_7392(self, account_id: str, reason: str = "Customer requested closure",
                                waive_early_closure_fee: bool = False) -> str:
        """Close a customer's bank account (checking or savings).

        Args:
            account_id (string): The ID of the bank account to close
            reason (string, optional): The reason for closing the account
            waive_early_closure_fee (boolean, optional): Whether to waive early closure fees

        Returns:
            Bank account closed successfully.
        """
        if not account_id:
            return "Error: Missing required parameter (account_id)."
        account = self.db.accounts.data.get(account_id)
        if account is None:
            return f"Error: Account '{account_id}' not found."
        if account.get("status") == "CLOSED":
            return f"Error: Account '{account_id}' is already closed."
        balance, fee = tables.account_balance(account), 0.0
        rule = EARLY_CLOSURE.get(account.get("class", ""), {}).get(account.get("level", ""))
        if not waive_early_closure_fee and rule and account.get("date_opened", ""):
            try:
                young = (tables.NOW - datetime.strptime(account["date_opened"], "%m/%d/%Y")).days < rule[1]
            except ValueError:
                young = False
            if young:
                if balance < rule[0]:
                    return "Error: Account unable to be closed."
                fee = rule[0]
        if balance - fee != 0:
            return f"Error: Account balance must be $0.00 before closing. Current balance: ${balance:.2f}"
        today = tables.today_str()
        account.update(status="CLOSED", date_closed=today, closure_reason=reason,
                       early_closure_fee_waived=waive_early_closure_fee)
        return (f"Bank account closed successfully!\n  - Account ID: {account_id}\n"
                f"  - Account Type: {account.get('account_type', 'N/A')}\n"
                f"  - Account Class: {account.get('account_class', 'N/A')}\n  - Status: CLOSED\n"
                f"  - Date Closed: {today}\n  - Reason: {reason}\n"
                f"  - Early Closure Fee Waived: {'Yes' if waive_early_closure_fee else 'No'}")

    @discoverable(ToolKind.READ)
    def get_all_user_accounts_by_user_id_3847(self, user_id: str) -> str:
        """Retrieve all accounts (checking, savings, credit cards) for a customer.

        Args:
            user_id (string): The customer's unique identifier in the system

        Returns:
            User accounts retrieved successfully.
        """
        if not user_id:
            return "Error: Missing required parameter: user_id"
        bank = tables.query_field(self.db, "accounts", "user_id", user_id)
        cards = tables.query_field(self.db, "credit_card_accounts", "user_id", user_id)
        return "\n".join([
            "User accounts retrieved successfully.", "", "Executed: get_all_user_accounts_by_user_id_3847",
            f"Accounts for user {user_id}:", "", "Bank Accounts:",
            bank if tables.found(bank) else "  No bank accounts found.", "\nCredit Card Accounts:",
            cards if tables.found(cards) else "  No credit card accounts found."])

    @discoverable(ToolKind.WRITE)
    def transfer_funds_between_bank_accounts_7291(self, source_account_id: str, destination_account_id: str,
                                                  amount: float) -> str:
        """Transfer funds from one bank account to another.

        Args:
            source_account_id (string): The account ID to transfer funds from
            destination_account_id (string): The account ID to transfer funds to
            amount (number): The amount to transfer in USD

        Returns:
            Funds transferred successfully.
        """
        if not source_account_id or not destination_account_id or amount is None:
            return "Error: Missing required parameters (source_account_id, destination_account_id, amount)."
        try:
            amount = float(amount)
        except (ValueError, TypeError):
            return f"Error: Invalid amount '{amount}'. Must be a number."
        if amount <= 0:
            return "Error: Transfer amount must be positive."
        if source_account_id == destination_account_id:
            return "Error: Source and destination accounts cannot be the same."
        accounts = self.db.accounts.data
        if source_account_id not in accounts:
            return f"Error: Source account '{source_account_id}' not found."
        if destination_account_id not in accounts:
            return f"Error: Destination account '{destination_account_id}' not found."
        source, dest = accounts[source_account_id], accounts[destination_account_id]
        if source.get("status") not in OPEN:
            return f"Error: Source account '{source_account_id}' is not active."
        if dest.get("status") not in OPEN:
            return f"Error: Destination account '{destination_account_id}' is not active."
        have = tables.account_balance(source)
        if have < amount:
            return (f"Error: Insufficient funds. Source account balance is ${have:.2f}, "
                    f"but transfer amount is ${amount:.2f}.")
        new_source, new_dest = have - amount, tables.account_balance(dest) + amount
        source["current_holdings"] = f"${new_source:.2f}"
        dest["current_holdings"] = f"${new_dest:.2f}"
        return (f"Transfer completed successfully!\n  - Amount: ${amount:.2f}\n"
                f"  - From: {source_account_id} (new balance: ${new_source:.2f})\n"
                f"  - To: {destination_account_id} (new balance: ${new_dest:.2f})")

    def _credit(self, account_id: str, amount: Any, credit_type: str, valid: list[str], savings: bool) -> str:
        """tau2's checking / savings credit: checks, the new balance, and a posted transaction."""
        if not account_id or amount is None or not credit_type:
            return "Error: Missing required parameters."
        try:
            amount = float(amount)
        except (TypeError, ValueError):
            return "Error: Invalid credit amount. Must be a number."
        if amount <= 0:
            return "Error: Credit amount must be positive."
        if credit_type not in valid:
            return f"Error: Invalid credit_type. Must be one of: {valid}"
        account = self.db.accounts.data.get(account_id)
        if account is None:
            return f"Error: Account '{account_id}' not found."
        kind = account.get("class", "").lower()
        if savings and kind not in ("saving", "savings"):
            return (f"Error: Account '{account_id}' is not a savings account. This tool only applies to savings "
                    "accounts.")
        if not savings and kind != "checking":
            return (f"Error: Account '{account_id}' is not a checking account. Credits can only be applied to "
                    "checking accounts.")
        if account.get("status") not in OPEN:
            return f"Error: Account '{account_id}' is not active."
        current = tables.account_balance(account)
        new = current + amount
        account["current_holdings"] = f"{new:.2f}" if savings else f"${new:.2f}"
        prefix = "savings_credit" if savings else "checking_credit"
        txn = "txn_" + tables.hex_id(f"{prefix}:{account_id}:{credit_type}:{amount}:{tables.today_str()}")
        description = {"rebate_credit": "REBATE CREDIT", "interest_correction": "INTEREST CORRECTION",
                       "goodwill_credit": "GOODWILL CREDIT"}.get(credit_type, "FEE REFUND") + " - CUSTOMER SERVICE"
        self.db.bank_account_transaction_history.data[txn] = {
            "transaction_id": txn, "account_id": account_id, "date": tables.today_str(), "description": description,
            "amount": amount, "type": credit_type, "status": "posted"}
        return (f"\nCredit applied successfully!\n  - Transaction ID: {txn}\n  - Account: {account_id}\n"
                f"  - Credit Type: {credit_type}\n  - Amount: ${amount:.2f}\n  - Previous Balance: ${current:.2f}\n"
                f"  - New Balance: ${new:.2f}")

    @discoverable(ToolKind.WRITE)
    def apply_checking_account_credit_5829(self, account_id: str, amount: float, credit_type: str) -> str:
        """Apply a credit to a customer's checking account.

        Args:
            account_id (string): The checking account ID to credit
            amount (number): The positive dollar amount to credit (must be greater than 0)
            credit_type (string): The type of credit: 'rebate_credit' for missing rebates, 'fee_refund' for incorrect fee charges

        Returns:
            Credit applied to checking account successfully.
        """
        return self._credit(account_id, amount, credit_type, ["rebate_credit", "fee_refund"], savings=False)

    @discoverable(ToolKind.WRITE)
    def apply_savings_account_credit_6831(self, account_id: str, amount: float, credit_type: str) -> str:
        """Apply a credit to a customer's savings account for interest corrections, fee refunds, or goodwill adjustments.

        Args:
            account_id (string): The savings account ID to credit
            amount (number): The positive dollar amount to credit (must be greater than 0)
            credit_type (string): The type of credit: 'interest_correction' for APY/interest calculation errors, 'fee_refund' for incorrect fee charges, 'goodwill_credit' for customer service gestures

        Returns:
            Credit applied to savings account successfully.
        """
        return self._credit(account_id, amount, credit_type, ["interest_correction", "fee_refund", "goodwill_credit"],
                            savings=True)

    @discoverable(ToolKind.WRITE)
    def submit_interest_discrepancy_report_7294(self, account_id: str, user_id: str, expected_apy: float,
                                                actual_apy: float, amount_difference: float) -> str:
        """Submit a report for interest calculation discrepancies to the backend team for investigation. Use this when the interest credited to a customer's account does not match expected APY calculations.

        Args:
            account_id (string): The savings account ID with the discrepancy
            user_id (string): The customer's unique identifier
            expected_apy (number): The APY percentage the customer should have received (e.g., 2.775 for 2.775%)
            actual_apy (number): The APY percentage that was actually applied (e.g., 2.5 for 2.5%)
            amount_difference (number): The dollar amount difference between expected and actual interest credited

        Returns:
            Interest discrepancy report submitted successfully. Backend team will investigate.
        """
        if not account_id or not user_id or expected_apy is None or actual_apy is None or amount_difference is None:
            return "Error: Missing required parameters."
        try:
            expected_apy, actual_apy, amount_difference = float(expected_apy), float(actual_apy), float(amount_difference)
        except (ValueError, TypeError):
            return "Error: expected_apy, actual_apy, and amount_difference must be numbers."
        account = self.db.accounts.data.get(account_id)
        if account is None:
            return f"Error: Account '{account_id}' not found."
        user = self.db.users.data.get(user_id)
        if user is None:
            return f"Error: User '{user_id}' not found."
        report = "IDR_" + tables.hex_id(
            f"interest_report:{account_id}:{user_id}:{expected_apy}:{actual_apy}:{tables.today_str()}")
        # tau2 adds the report to a table its DB does not have: nothing is stored
        tables.add(self.db, "interest_discrepancy_reports", report, {})
        level = account.get("level", "Unknown")
        return (f"\nInterest Discrepancy Report Submitted Successfully!\n  - Report ID: {report}\n"
                f"  - Account: {account_id} ({level})\n  - Customer: {user.get('name', 'Unknown')}\n"
                f"  - Expected APY: {expected_apy}%\n  - Actual APY: {actual_apy}%\n"
                f"  - APY Difference: {round(expected_apy - actual_apy, 4)}%\n"
                f"  - Amount Difference: ${amount_difference:.2f}\n  - Status: PENDING_REVIEW\n"
                "\nThe backend team will investigate this discrepancy and ensure "
                "correct APY calculations are applied going forward.")

    @discoverable(ToolKind.READ)
    def get_bank_account_transactions_9173(self, account_id: str) -> str:
        """Retrieve the transaction history for a bank account.

        Transactions are returned in reverse chronological order (most recent
        first).

        Args:
            account_id (string): The bank account ID to retrieve transactions for

        Returns:
            Bank account transactions retrieved successfully.
        """
        if not account_id:
            return "Error: Missing required parameter: account_id"
        if account_id not in self.db.accounts.data:
            return f"Error: Account '{account_id}' not found."
        # most recent first; a stable sort keeps same-date records in their stored order (tau2's tie rule)
        txns = sorted(tables.query(self.db, "bank_account_transaction_history", account_id=account_id), key=txn_date,
                      reverse=True)
        listing = tables.listing(txns, "bank_account_transaction_history") if txns else \
            "\nNo transactions found for this account."
        return "\n".join(["Bank account transactions retrieved successfully.", "",
                          "Executed: get_bank_account_transactions_9173", f"Transactions for account {account_id}:",
                          listing])


named_as("KnowledgeTools", AccountTools)
