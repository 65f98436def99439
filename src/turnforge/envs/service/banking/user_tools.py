"""The banking customer's tools (tau2-bench `banking_knowledge/tools.py` KnowledgeUserTools): the user simulator
works on the same DB as the agent. Listed tools: apply for a credit card, submit a referral or a card transaction,
ask for a human, and call a discoverable tool the agent gave them (whose use is logged); a task's `user_tools`
says which of the listed ones its user gets (envs/service/env.py).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.discoverable import discoverable, discoverable_tools, named_as
from turnforge.envs.service.toolkit import ToolKind, Toolkit, tool

CREDIT_CARD_TYPES = [
    "Bronze Rewards Card", "Business Bronze Rewards Card", "Business Gold Rewards Card",
    "Business Platinum Rewards Card", "Business Silver Rewards Card", "Crypto-Cash Back", "Diamond Elite Card",
    "EcoCard", "Gold Rewards Card", "Green Rewards Card", "Platinum Rewards Card", "Silver Rewards Card",
    "Silver Zoom Card",
]
# tau2's CREDIT_CARD_REWARDS: card type -> category -> reward percentage ("default" for the other categories)
CREDIT_CARD_REWARDS: dict[str, dict[str, float]] = {
    "Bronze Rewards Card": {"default": 1.0},
    "Silver Rewards Card": {"Travel": 4.0, "Software": 4.0, "default": 1.0},
    "Gold Rewards Card": {"default": 2.5},
    "Platinum Rewards Card": {"default": 10.0},
    "Business Bronze Rewards Card": {"default": 1.0},
    "Business Silver Rewards Card": {"Travel": 10.0, "Software": 10.0, "default": 1.0},
    "Green Rewards Card": {"Sustainable": 3.0, "default": 1.0},
    "Business Gold Rewards Card": {"Operations": 2.5, "default": 1.0},
    "Business Platinum Rewards Card": {"Travel": 4.0, "Software": 4.0, "Media": 4.0, "default": 1.5},
    "Silver Zoom Card": {"Transportation": 3.0, "default": 1.0},
    "Diamond Elite Card": {"default": 5.0},
    "EcoCard": {"Green": 5.0, "default": 1.0},
    "Crypto-Cash Back": {"default": 2.0},
}


def _executed(name: str, args: dict) -> str:
    return f"\n\nExecuted: {name}\nArguments: {json.dumps(args, indent=2)}\n"


class UserDiscoverableTools:
    """The user's discoverable tools: each checks the agent gave it and logs the call, as tau2's."""

    db: Any

    def _not_given(self, name: str) -> str | None:
        if tables.found(tables.query_field(self.db, "user_discoverable_tools", "tool_name", name)):
            return None
        return (f"Error: Tool '{name}' has not been given to you by the agent. "
                f"The agent must first use `give_discoverable_user_tool` to give this tool to you.")

    def _log_call(self, name: str, args: dict) -> None:
        tables.add(self.db, "user_discoverable_tool_calls", tables.tool_call_record_id(name, args),
                   {"tool_name": name, "arguments": args, "called_at": tables.today_str(), "status": "CALLED"})

    @discoverable(ToolKind.WRITE)
    def submit_cash_back_dispute_0589(self, user_id: str, transaction_id: str) -> str:
        """Submit a cash back dispute for a specific transaction.

        Args:
            user_id (string): The user's unique identifier in the system
            transaction_id (string): The unique identifier for the transaction with incorrect cash back

        Returns:
            Cash back dispute submitted successfully. Your case has been queued for review.
        """
        name, args = "submit_cash_back_dispute_0589", {"user_id": user_id, "transaction_id": transaction_id}
        if error := self._not_given(name):
            return error
        self._log_call(name, args)
        dispute = tables.dispute_id(user_id, transaction_id)
        record = {"dispute_id": dispute, "user_id": user_id, "transaction_id": transaction_id,
                  "submitted_at": tables.today_str()}
        settings = self.db.task_config.data.get("dispute_settings", {}) if self.db.task_config.data else {}
        if settings.get("auto_resolve_disputes", False):
            record.update(status="RESOLVED", resolution="APPROVED")
            status = ("Status: RESOLVED - The dispute has been reviewed and approved. The transaction rewards need to "
                      "be updated.")
        else:
            record["status"] = "SUBMITTED"
            status = "Status: SUBMITTED - Your dispute has been queued for review."
        added = tables.add(self.db, "cash_back_disputes", dispute, record)
        text = "Cash back dispute submitted successfully. Your case has been queued for review." + _executed(name, args)
        return text + (f"Dispute ID: {dispute}\n{status}" if added else
                       "Note: Dispute may have already been submitted for this transaction.")

    @discoverable(ToolKind.WRITE)
    def get_referral_link(self, user_id: str, card_name: str) -> str:
        """Generate a referral link for a specific credit card to share with friends or family.

        Args:
            user_id (string): The user's unique identifier in the system (the referrer)
            card_name (string): The name of the credit card to create a referral for (e.g., 'Gold Rewards Card')

        Returns:
            Referral link generated successfully. Share this link with the person you want to refer.
        """
        name, args = "get_referral_link", {"user_id": user_id, "card_name": card_name}
        if error := self._not_given(name):
            return error
        self._log_call(name, args)
        referral = tables.hex_id(f"referral_link:{user_id}:{card_name}")
        added = tables.add(self.db, "referrals", referral, {
            "referral_id": referral, "referrer_id": user_id, "referred_account_type": card_name,
            "referral_status": "NO_PROGRESS", "date": tables.today_str()})
        text = ("Referral link generated successfully. Share this link with the person you want to refer."
                + _executed(name, args))
        return text + (f"Referral ID: {referral}\nReferral link: https://rhobank.com/refer/{referral}" if added else
                       "Note: A referral link for this card may have already been generated.")

    @discoverable(ToolKind.READ)
    def get_card_last_4_digits(self, credit_card_account_id: str) -> str:
        """Look up the last 4 digits of a credit card number.

        Args:
            credit_card_account_id (string): The credit card account ID to look up (e.g., 'cc_76ad9cc60e_gold')

        Returns:
            Card information retrieved successfully.
        """
        name, args = "get_card_last_4_digits", {"credit_card_account_id": credit_card_account_id}
        if error := self._not_given(name):
            return error
        self._log_call(name, args)
        if not tables.found(tables.query_field(self.db, "credit_card_accounts", "account_id", credit_card_account_id)):
            return f"Error: Credit card account '{credit_card_account_id}' not found."
        digest = hashlib.sha256(f"card_last4:{credit_card_account_id}".encode()).hexdigest()
        last_4 = "".join(c for c in digest if c.isdigit())[:4].ljust(4, "0")
        return "Card information retrieved successfully." + _executed(name, args) + f"Last 4 digits of card: {last_4}"

    @discoverable(ToolKind.WRITE)
    def deposit_check_3847(self, account_id: str, check_amount: float) -> str:
        """Deposit a check into a checking or savings account. The user takes a photo of the check and submits it through their mobile banking app.

        Args:
            account_id (string): The bank account ID to deposit the check into
            check_amount (number): The amount of the check in USD

        Returns:
            Check deposited successfully. Funds will be available according to your account's deposit policy.
        """
        name, args = "deposit_check_3847", {"account_id": account_id, "check_amount": check_amount}
        if error := self._not_given(name):
            return error
        self._log_call(name, args)
        try:
            check_amount = float(check_amount)
        except (ValueError, TypeError):
            return f"Error: Invalid check amount '{check_amount}'. Must be a number."
        if check_amount <= 0:
            return "Error: Check amount must be positive."
        account = self.db.accounts.data.get(account_id)
        if account is None:
            return f"Error: Account '{account_id}' not found."
        if account.get("status") not in ("ACTIVE", "OPEN"):
            return f"Error: Account '{account_id}' is not active."
        current = tables.account_balance(account)
        new = current + check_amount
        account["current_holdings"] = f"${new:.2f}"
        return ("Check deposited successfully. Funds will be available according to your account's deposit policy."
                + _executed(name, args) + f"Check deposit processed!\n  - Account: {account_id}\n"
                f"  - Check Amount: ${check_amount:.2f}\n  - Previous Balance: ${current:.2f}\n"
                f"  - New Balance: ${new:.2f}")


named_as("KnowledgeUserTools", UserDiscoverableTools)


class KnowledgeUserTools(UserDiscoverableTools, Toolkit):
    """The customer's listed tools (class name as tau2's: argument errors name it)."""

    @classmethod
    def callable_names(cls) -> set[str]:
        return set(cls.tool_kinds()) | set(discoverable_tools(cls))

    @tool(ToolKind.WRITE)
    def apply_for_credit_card(self, card_type: str, customer_name: str, annual_income: float,
                              rho_bank_subscription: bool = False) -> str:
        """Apply for a credit card.

        Args:
            card_type: Type of credit card
            customer_name: Full legal name
            annual_income: Annual income in USD
            rho_bank_subscription: Whether user has Rho-Bank+ subscription
        """
        if card_type not in CREDIT_CARD_TYPES:
            return f"Error: Invalid card_type '{card_type}'. Must be one of: {CREDIT_CARD_TYPES}"
        try:  # a float, so 100000 and 100000.0 give the same application id
            annual_income = float(annual_income)
        except (TypeError, ValueError):
            return "Error: Invalid annual_income. Must be a number."
        application = tables.hex_id(f"credit_card:{card_type}:{customer_name}:{annual_income}:{rho_bank_subscription}")
        record = {"application_id": application, "card_type": card_type, "customer_name": customer_name,
                  "annual_income": annual_income, "rho_bank_subscription": rho_bank_subscription, "status": "PENDING",
                  "date": tables.today_str()}
        if not tables.add(self.db, "credit_card_applications", application, record):
            return f"Failed to submit application: Record ID '{application}' may already exist."
        return ("Credit card application submitted:\nYour application has been successfully submitted. "
                "You will receive a decision within 5-7 business days via email.")

    @tool(ToolKind.WRITE)
    def submit_referral(self, user_id: str, account_type: str) -> str:
        """Submit a referral request to refer someone to open an account.

        Args:
            user_id: Your user ID (the referrer)
            account_type: The type of account you are referring someone to open
        """
        referral, today = tables.hex_id(f"referral:{user_id}:{account_type}"), tables.today_str()
        record = {"referral_id": referral, "referrer_id": user_id, "referred_account_type": account_type,
                  "referral_status": "NO_PROGRESS", "date": today}
        if not tables.add(self.db, "referrals", referral, record):
            return f"Failed to submit referral: Record ID '{referral}' may already exist."
        return (f"Referral request submitted successfully!\n  - Referral ID: {referral}\n  - Referrer ID: {user_id}\n"
                f"  - Account Type: {account_type}\n  - Status: NO_PROGRESS\n  - Date: {today}\n\n"
                "Share your referral ID with the person you're referring. "
                "They will need to use this when applying for their account.")

    def query_database(self, database_name: str, constraints: str = "{}") -> str:
        """Not a tool (as in tau2): a query of any table."""
        return tables.query_text(self.db, database_name, constraints)

    @tool(ToolKind.WRITE)
    def call_discoverable_user_tool(self, discoverable_tool_name: str, arguments: str = "{}") -> str:
        """Call a tool that was given to you by the agent.

        Use this when the agent has instructed you to perform an action using
        a discoverable tool. The agent will have told you the tool name and arguments.

        This simulates you performing the action in the real world (e.g., opening
        a webpage, navigating to a section, clicking a button).

        Args:
            discoverable_tool_name: The name of the discoverable tool to call (e.g., "open_webpage")
            arguments: JSON string of arguments for the tool (e.g., '{"url": "https://example.com"}')

        Returns:
            The result of executing the discoverable tool
        """
        method = discoverable_tools(type(self)).get(discoverable_tool_name)
        if method is None:
            return f"Error: Unknown discoverable tool '{discoverable_tool_name}'."
        try:  # every JSON number a float, as tau2 reads them
            args = json.loads(arguments, parse_int=float)
        except json.JSONDecodeError as e:
            return f"Error: Invalid JSON in arguments: {e}"
        params = inspect.signature(method).parameters
        for name, param in params.items():
            if name != "self" and param.default is inspect.Parameter.empty and name not in args:
                return f"Error: Missing required parameter: {name}"
        for name in args:
            if name not in params:
                return f"Error: Unexpected parameter: {name}"
        try:
            return getattr(self, discoverable_tool_name)(**args)
        except TypeError as e:
            return f"Error: Invalid arguments for tool '{discoverable_tool_name}': {e}"

    @tool(ToolKind.READ)
    def list_discoverable_user_tools(self) -> str:
        """List all tools that have been given to you by the agent.

        Use this to see what actions the agent has instructed you to perform.

        Returns:
            A list of tools that have been given to you
        """
        result = tables.query_text(self.db, "user_discoverable_tools", "{}")
        if "No results found" in result:  # (tau2 tests for a text its query never gives)
            return "No tools have been given to you yet by the agent."
        return f"Tools given to you by the agent:\n{result}"

    @tool(ToolKind.WRITE)
    def request_human_agent_transfer(self) -> str:
        """Request to be transferred to a human agent for assistance.

        Use this when you want to speak with a real human agent instead of
        the automated system. Each request will be logged and processed.

        Returns:
            Confirmation that your transfer request has been submitted
        """
        existing = tables.query_text(self.db, "human_transfer_requests", "{}")
        count = existing.count("request_id") + 1 if tables.found(existing) else 1
        request = f"transfer_request_{count}"
        tables.add(self.db, "human_transfer_requests", request, {
            "request_id": request, "request_number": count, "requested_at": tables.today_str(), "status": "PENDING"})
        return f"Transfer request #{count} submitted.\nThe agent will process your request."

    @tool(ToolKind.WRITE)
    def submit_transaction(self, user_id: str, credit_card_type: str, merchant_name: str, amount: float,
                           category: str) -> str:
        """Submit a credit card transaction.

        Args:
            user_id: Your user ID
            credit_card_type: Type of credit card used (e.g., "Bronze Rewards Card", "Gold Rewards Card")
            merchant_name: Name of the merchant where the purchase was made
            amount: Transaction amount in USD (e.g., 127.43)
            category: Transaction category (e.g., "Groceries", "Dining", "Travel", "Software", "Entertainment", "Utilities", "Shopping")
        """
        if credit_card_type not in CREDIT_CARD_REWARDS:
            return (f"Error: Unknown credit card type '{credit_card_type}'. "
                    f"Available types: {list(CREDIT_CARD_REWARDS)}")
        txn, today = tables.transaction_id(user_id, credit_card_type, merchant_name, amount, category), tables.today_str()
        rewards = CREDIT_CARD_REWARDS[credit_card_type]
        rate = rewards.get(category, rewards["default"])
        points = int(amount * rate)
        record = {"transaction_id": txn, "user_id": user_id, "credit_card_type": credit_card_type,
                  "merchant_name": merchant_name, "transaction_amount": f"${amount:.2f}", "transaction_date": today,
                  "category": category, "status": "COMPLETED", "rewards_earned": f"{points} points"}
        if not tables.add(self.db, "credit_card_transaction_history", txn, record):
            return f"Failed to submit transaction: Record ID '{txn}' may already exist."
        return (f"Transaction submitted successfully!\n  - Transaction ID: {txn}\n  - User ID: {user_id}\n"
                f"  - Card Type: {credit_card_type}\n  - Merchant: {merchant_name}\n  - Amount: ${amount:.2f}\n"
                f"  - Category: {category}\n  - Date: {today}\n"
                f"  - Rewards Earned: {points} points ({rate}% cashback rate)\n")
