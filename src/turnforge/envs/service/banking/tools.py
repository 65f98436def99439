"""The banking_knowledge agent toolkit (tau2-bench `banking_knowledge/tools.py` KnowledgeTools, `retrieval_mixins.py`):
its listed tools with tau2's names, schemas, checks and texts, and the discoverable-tool protocol.

The listed tools look up users, log identity verifications, change an email, transfer to a human, and unlock /
call the agent's discoverable tools (agent_tools.py) or give the user one of theirs (user_tools.py). A call of a
discoverable tool through `call_discoverable_agent_tool` is logged in `agent_discoverable_tools` when the tool
changes state, or when it is a read the task's gold actions call (tau2's read-log allowlist, set per task by
`start_task`): an extra look-up the agent makes to be careful leaves the DB as the gold one. The retrieval tools
(`KB_search`, `grep`) come from the variant (variants.py) as mixins, as tau2 composes them.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Literal, get_args

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.agent_tools import AgentDiscoverableTools
from turnforge.envs.service.banking.discoverable import (
    discoverable_tools,
    format_for_agent,
    mutates,
    tool_info,
)
from turnforge.envs.service.banking.knowledge import KnowledgeBase, grep_text, kb_search_text
from turnforge.envs.service.banking.user_tools import KnowledgeUserTools
from turnforge.envs.service.toolkit import ToolKind, Toolkit, tool

TransferReason = Literal[
    "fraud_or_security_concern", "account_closure_request", "deceased_account_holder", "legal_or_regulatory_matter",
    "account_ownership_dispute", "complex_billing_dispute", "abusive_customer_behavior", "third_party_inquiry",
    "technical_system_error", "unconfirmed_external_communication", "customer_demands_after_unavailable_offer_refusal",
    "kb_search_unsuccessful_customer_requests_transfer", "specialized_department_required",
    "accessibility_or_special_needs", "customer_frustrated_demands_human", "supervisor_request_service_complaint",
    "customer_requests_human_no_specific_reason", "request_completed_customer_wants_human_followup", "other",
]


class KnowledgeTools(AgentDiscoverableTools, Toolkit):
    """The agent's tools over the banking DB (class name as tau2's: argument errors name it)."""

    def __init__(self, db: Any):
        super().__init__(db)
        self.unlocked: dict[str, dict] = {}
        self.read_log_allowlist: set[str] = set()

    @classmethod
    def callable_names(cls) -> set[str]:
        return set(cls.tool_kinds()) | set(discoverable_tools(cls))

    def start_task(self, task: dict) -> None:
        """tau2's `_derive_read_log_allowlist`: the tools the gold actions call through call_discoverable_agent_tool."""
        actions = (task.get("evaluation_criteria") or {}).get("actions") or []
        self.read_log_allowlist = {(a.get("arguments") or {}).get("agent_tool_name") for a in actions
                                   if a.get("name") == "call_discoverable_agent_tool"} - {None}

    @tool(ToolKind.GENERIC)
    def transfer_to_human_agents(self, summary: str, reason: TransferReason = "other") -> str:
        """Transfer the user to a human agent.

        The proper transfer reason enum can be found in the knowledge base: search it before calling this tool to select the proper applicable reason.

        Args:
            summary: A summary of the user's issue and what was attempted before transfer.
            reason: The specific reason code for the transfer.
        """
        reasons = list(get_args(TransferReason))
        if reason not in reasons:
            return f"Error: Invalid transfer reason '{reason}'. Must be one of: {', '.join(reasons)}"
        return f"Transfer successful (reason: {reason}). A human agent will assist you shortly."

    @tool(ToolKind.READ)
    def get_current_time(self) -> str:
        """Get the current time. Use this to get the current timestamp for logging verification records.

        Returns:
            The current time in the format "YYYY-MM-DD HH:MM:SS TZ"
        """
        return "The current time is 2025-11-14 03:40:00 EST."

    @tool(ToolKind.READ)
    def get_user_information_by_id(self, user_id: str) -> str:
        """Get the information (date of birth, email, phone number, address) for a user by their user id.

        Args:
            user_id: The ID of the user
        """
        return tables.query_field(self.db, "users", "user_id", user_id)

    @tool(ToolKind.READ)
    def get_user_information_by_name(self, customer_name: str) -> str:
        """Get the information (date of birth, email, phone number, address) for a user by their name. Case Sensitive.

        Args:
            customer_name: The name of the user
        """
        return tables.query_field(self.db, "users", "name", customer_name)

    @tool(ToolKind.READ)
    def get_user_information_by_email(self, email: str) -> str:
        """Get the information (date of birth, email, phone number, address) for a user by their email.

        Args:
            email: The email of the user
        """
        return tables.query_field(self.db, "users", "email", email)

    @tool(ToolKind.WRITE)
    def change_user_email(self, user_id: str, new_email: str) -> str:
        """Change the email address for a user.

        Args:
            user_id: The ID of the user whose email should be changed
            new_email: The new email address to set for the user
        """
        if tables.update(self.db, "users", user_id, {"email": new_email}) is None:
            return f"Error: User with ID '{user_id}' not found."
        return f"Email updated successfully.\n  - User ID: {user_id}\n  - New Email: {new_email}"

    @tool(ToolKind.READ)
    def get_referrals_by_user(self, user_id: str) -> str:
        """Get all referrals made by a user.

        Args:
            user_id: The ID of the user (referrer) to look up referrals for
        """
        return tables.query_field(self.db, "referrals", "referrer_id", user_id)

    @tool(ToolKind.READ)
    def get_credit_card_transactions_by_user(self, user_id: str) -> str:
        """Get all credit card transactions for a user.

        Args:
            user_id: The ID of the user to look up transactions for
        """
        return tables.query_field(self.db, "credit_card_transaction_history", "user_id", user_id)

    @tool(ToolKind.READ)
    def get_credit_card_accounts_by_user(self, user_id: str) -> str:
        """Get all credit card accounts for a user.

        Returns information about each credit card account including card type,
        date opened, current balance, and reward points.

        Args:
            user_id: The ID of the user to look up credit card accounts for
        """
        return tables.query_field(self.db, "credit_card_accounts", "user_id", user_id)

    @tool(ToolKind.WRITE)
    def log_verification(self, name: str, user_id: str, address: str, email: str, phone_number: str,
                         date_of_birth: str, time_verified: str) -> str:
        """Log a verification record after successfully verifying a user's identity.

        Call this tool after you have verified a user by confirming 2 out of 4 identity fields
        (date of birth, email, phone number, address). This creates an audit record of the verification.

        Args:
            name: The verified user's full name
            user_id: The verified user's ID
            address: The verified user's address
            email: The verified user's email
            phone_number: The verified user's phone number
            date_of_birth: The verified user's date of birth (MM/DD/YYYY format)
            time_verified: The timestamp of the verification (e.g., "2025-11-14 03:40:00 EST")
        """
        record = {"name": name, "user_id": user_id, "address": address, "email": email, "phone_number": phone_number,
                  "date_of_birth": date_of_birth, "time_verified": time_verified}
        if not tables.add(self.db, "verification_history", tables.verification_id(user_id, time_verified), record):
            return "Failed to log verification: Record may already exist."
        return f"Verification logged successfully.\n  - User: {name} (ID: {user_id})\n  - Verified at: {time_verified}"

    @tool(ToolKind.GENERIC)
    def give_discoverable_user_tool(self, discoverable_tool_name: str, arguments: str = "{}") -> str:
        """Pass a tool to the user so they can execute it themselves.

        Use this when the knowledge base indicates that the user should perform
        an action themselves (e.g., "to do X, have the user call tool_name(args)").

        The user will then be able to call `call_discoverable_tool` with the same
        tool name and arguments to simulate executing the action.

        Args:
            discoverable_tool_name: The name of the discoverable tool (e.g., "open_webpage", "navigate_to_section")
            arguments: JSON string of arguments for the tool (e.g., '{"url": "https://example.com"}')

        Returns:
            A confirmation message with instructions for the user
        """
        method = discoverable_tools(KnowledgeUserTools).get(discoverable_tool_name)
        if method is None:
            return f"Error: Unknown discoverable tool '{discoverable_tool_name}'."
        try:
            args = json.loads(arguments)
        except json.JSONDecodeError as e:
            return f"Error: Invalid JSON in arguments: {e}"
        params = inspect.signature(method).parameters
        for name in args:  # (the user fills in what is missing)
            if name not in params and name != "self":
                return f"Error: Unexpected parameter: {name}"
        info = tool_info(method)
        tables.add(self.db, "user_discoverable_tools", tables.tool_record_id("user", discoverable_tool_name),
                   {"tool_name": discoverable_tool_name, "status": "GIVEN"})
        shown = json.dumps(args, indent=2) if args else "(no arguments)"
        return (f"Tool given to user: {discoverable_tool_name}\nDescription: {info['description']}\n"
                f"Arguments: {shown}\n\nThe user can now execute this action by calling `call_discoverable_user_tool` "
                f"with discoverable_tool_name='{discoverable_tool_name}' and the same arguments.")

    @tool(ToolKind.GENERIC)
    def unlock_discoverable_agent_tool(self, agent_tool_name: str) -> str:
        """Unlock an agent discoverable tool that was found in the knowledge base.

        Use this when the knowledge base indicates that you have access to a specialized
        internal tool. The knowledge base will tell you the tool name to unlock.

        After unlocking, you can use the tool by calling `call_discoverable_agent_tool` with
        the tool name and required arguments.

        Args:
            agent_tool_name: The name of the agent discoverable tool to unlock
                            (e.g., "calculate_apr_adjustment_7842")

        Returns:
            A confirmation message with the tool's description and parameters
        """
        method = discoverable_tools(type(self)).get(agent_tool_name)
        if method is None:
            return f"Error: Unknown agent tool '{agent_tool_name}'. This tool is not available."
        info = tool_info(method)
        self.unlocked[agent_tool_name] = info  # in memory only; the DB records calls
        return (f"Tool unlocked: {agent_tool_name}\nDescription: {info['description']}\n\n{format_for_agent(info)}\n\n"
                f"You can now use this tool by calling `call_discoverable_agent_tool` with "
                f"agent_tool_name='{agent_tool_name}' and the required arguments.")

    @tool(ToolKind.WRITE)
    def call_discoverable_agent_tool(self, agent_tool_name: str, arguments: str = "{}") -> str:
        """Call an agent discoverable tool that you have previously unlocked.

        Use this after unlocking a tool with `unlock_discoverable_agent_tool`. The knowledge base
        will tell you which tool to use and what arguments to provide.

        Args:
            agent_tool_name: The name of the agent discoverable tool to call
            arguments: JSON string of arguments for the tool (e.g., '{"user_id": "abc123"}')

        Returns:
            The result of executing the agent tool
        """
        method = discoverable_tools(type(self)).get(agent_tool_name)
        if method is None:
            return f"Error: Unknown agent tool '{agent_tool_name}'. This tool is not available."
        if agent_tool_name not in self.unlocked:
            return (f"Error: Tool '{agent_tool_name}' has not been unlocked. "
                    f"You must first use `unlock_discoverable_agent_tool` to unlock this tool before calling it.")
        try:  # tau2 reads every JSON number as a float, so 33 and 33.0 give the same ids and DB
            args = json.loads(arguments, parse_int=float)
        except json.JSONDecodeError as e:
            return f"Error: Invalid JSON in arguments: {e}"
        try:
            result = getattr(self, agent_tool_name)(**args)
        except TypeError as e:
            return f"Error: Invalid arguments: {e}"
        if mutates(method) or agent_tool_name in self.read_log_allowlist:
            tables.add(self.db, "agent_discoverable_tools", tables.tool_record_id("agent", agent_tool_name),
                       {"tool_name": agent_tool_name, "status": "CALLED"})
        return result

    @tool(ToolKind.READ)
    def list_discoverable_agent_tools(self) -> str:
        """List all agent discoverable tools that you have called.

        Use this to see what specialized tools you have used.

        Returns:
            A list of tools that you have called
        """
        result = tables.query_text(self.db, "agent_discoverable_tools", "{}")
        if "No results found" in result:  # (tau2 tests for a text its query never gives)
            return "No agent tools have been called yet. Search the knowledge base to discover available tools."
        return f"Your called agent tools:\n{result}"


class KBSearchMixin:
    """tau2's KB_search (BM25 over the knowledge base, `self.kb`)."""

    kb: KnowledgeBase

    @tool(ToolKind.READ)
    def KB_search(self, query: str) -> str:  # noqa: N802 (tau2's tool name)
        """Search the knowledge base for relevant documents.

        Args:
            query: The search query to find relevant documents

        Returns:
            Relevant document excerpts matching the query
        """
        return kb_search_text(self.kb, query)


class GrepMixin:
    """tau2's grep over the knowledge base (`self.kb`)."""

    kb: KnowledgeBase

    @tool(ToolKind.READ)
    def grep(self, pattern: str) -> str:
        """Search for a regex pattern in all knowledge base documents.

        Returns documents ranked by number of matches, with full content.

        Args:
            pattern: The regex pattern to search for (e.g., 'credit.*card', 'fee|charge')

        Returns:
            Matching documents ranked by relevance (match count)
        """
        return grep_text(self.kb, pattern)


def variant_toolkit(kb: KnowledgeBase, kb_search: bool, grep: bool) -> type[KnowledgeTools]:
    """The agent's toolkit class of a retrieval variant: KnowledgeTools plus its retrieval tools over `kb`."""
    mixins = ((KBSearchMixin,) if kb_search else ()) + ((GrepMixin,) if grep else ())
    return type("KnowledgeTools", (*mixins, KnowledgeTools), {"kb": kb})
