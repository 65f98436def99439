"""The banking_knowledge DB (tau2-bench `domains/banking_knowledge/data_model.py`, `db_query.py`, `utils.py`).

Every table is `{"data": {record id: record dict}, "notes": str}`, as tau2's `DatabaseTable`, so `model_dump()`
(and so tau2's DB hash) is the same. The helpers are tau2's table operations with their texts: the
`query_database_tool` listing (its "No records found in ..." text is what many tools test for), adding a record
that must be new, updating fields of one record. Ids are tau2's deterministic sha256 ids, and "today" is tau2's
fixed 11/14/2025 03:40 EST.
"""

from __future__ import annotations

import hashlib
import json
import operator
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TODAY = date(2025, 11, 14)  # tau2 KNOWLEDGE_FIXED_DATE
NOW = datetime(2025, 11, 14, 3, 40, 0)  # tau2 get_now


def today_str() -> str:
    """tau2's get_today_str: MM/DD/YYYY."""
    return TODAY.strftime("%m/%d/%Y")


class DatabaseTable(BaseModel):
    data: dict[str, dict[str, Any]] = Field(default_factory=dict)
    notes: str = ""


TABLES = (
    "users", "accounts", "debit_cards", "referrals", "credit_card_applications", "user_discoverable_tools",
    "user_discoverable_tool_calls", "verification_history", "credit_card_transaction_history", "cash_back_disputes",
    "bank_account_transaction_history", "credit_card_accounts", "agent_discoverable_tools", "task_config",
    "human_transfer_requests", "transaction_disputes", "credit_card_orders", "debit_card_orders",
    "credit_card_closure_reasons", "credit_card_account_flags", "credit_limit_increase_requests", "payment_history",
    "debit_card_disputes",
)


class TransactionalDB(BaseModel):
    """tau2's TransactionalDB: the tables in its field order (extra keys forbidden, as tau2's DB)."""

    model_config = ConfigDict(extra="forbid")

    users: DatabaseTable = Field(default_factory=DatabaseTable)
    accounts: DatabaseTable = Field(default_factory=DatabaseTable)
    debit_cards: DatabaseTable = Field(default_factory=DatabaseTable)
    referrals: DatabaseTable = Field(default_factory=DatabaseTable)
    credit_card_applications: DatabaseTable = Field(default_factory=DatabaseTable)
    user_discoverable_tools: DatabaseTable = Field(default_factory=DatabaseTable)
    user_discoverable_tool_calls: DatabaseTable = Field(default_factory=DatabaseTable)
    verification_history: DatabaseTable = Field(default_factory=DatabaseTable)
    credit_card_transaction_history: DatabaseTable = Field(default_factory=DatabaseTable)
    cash_back_disputes: DatabaseTable = Field(default_factory=DatabaseTable)
    bank_account_transaction_history: DatabaseTable = Field(default_factory=DatabaseTable)
    credit_card_accounts: DatabaseTable = Field(default_factory=DatabaseTable)
    agent_discoverable_tools: DatabaseTable = Field(default_factory=DatabaseTable)
    task_config: DatabaseTable = Field(default_factory=DatabaseTable)
    human_transfer_requests: DatabaseTable = Field(default_factory=DatabaseTable)
    transaction_disputes: DatabaseTable = Field(default_factory=DatabaseTable)
    credit_card_orders: DatabaseTable = Field(default_factory=DatabaseTable)
    debit_card_orders: DatabaseTable = Field(default_factory=DatabaseTable)
    credit_card_closure_reasons: DatabaseTable = Field(default_factory=DatabaseTable)
    credit_card_account_flags: DatabaseTable = Field(default_factory=DatabaseTable)
    credit_limit_increase_requests: DatabaseTable = Field(default_factory=DatabaseTable)
    payment_history: DatabaseTable = Field(default_factory=DatabaseTable)
    debit_card_disputes: DatabaseTable = Field(default_factory=DatabaseTable)


# tau2's db_query._load_databases: the tables a query may name, in its order
QUERYABLE = (
    "users", "accounts", "referrals", "credit_card_applications", "user_discoverable_tools",
    "user_discoverable_tool_calls", "agent_discoverable_tools", "task_config", "verification_history",
    "credit_card_transaction_history", "cash_back_disputes", "bank_account_transaction_history",
    "credit_card_accounts", "human_transfer_requests", "transaction_disputes", "credit_card_orders",
    "credit_card_closure_reasons", "credit_card_account_flags", "debit_cards", "debit_card_orders",
    "debit_card_disputes", "credit_limit_increase_requests", "payment_history",
)

_OPS = {
    "eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le,
    "contains": lambda a, b: b in a if a is not None else False,
    "startswith": lambda a, b: str(a).startswith(str(b)) if a is not None else False,
    "endswith": lambda a, b: str(a).endswith(str(b)) if a is not None else False,
    "in": lambda a, b: a in b, "nin": lambda a, b: a not in b,
}


def _matches(record: dict, constraints: dict) -> bool:
    """tau2's `_record_matches`: `field` or `field__op` constraints; a comparison that raises is no match."""
    for key, expected in constraints.items():
        field, op = key.rsplit("__", 1) if "__" in key else (key, "eq")
        try:
            if not _OPS.get(op, operator.eq)(record.get(field), expected):
                return False
        except (TypeError, ValueError):
            return False
    return True


def query(db: Any, table: str, **constraints: Any) -> list[tuple[str, dict]]:
    """(record id, record) of `table` matching `constraints` (tau2's query_db with return_ids)."""
    if table not in QUERYABLE:
        return []
    return [(k, r) for k, r in getattr(db, table).data.items() if _matches(r, constraints)]


def query_text(db: Any, table: str, constraints: str = "{}") -> str:
    """tau2's `query_database_tool`: the matching records as numbered text, or its error / "No records" texts."""
    try:
        if table not in QUERYABLE:
            return f"Error: Database '{table}' not found. Available: {list(QUERYABLE)}"
        try:
            parsed = json.loads(constraints) if constraints else {}
        except json.JSONDecodeError as e:
            return f"Error: Invalid JSON: {e}"
        results = query(db, table, **parsed)
        return listing(results, table) if results else f"No records found in '{table}'."
    except Exception as e:  # tau2 reports any failure of the query as text
        return f"Error querying database: {e}"


def listing(records: list[tuple[str, dict]], table: str) -> str:
    """tau2's numbered listing of (record id, record) pairs, every field on its own line."""
    lines = [f"Found {len(records)} record(s) in '{table}':\n"]
    for i, (record_id, record) in enumerate(records, 1):
        lines.append(f"{i}. Record ID: {record_id}")
        lines += [f"   {field}: {value}" for field, value in record.items()]
        lines.append("")
    return "\n".join(lines)


def query_field(db: Any, table: str, field: str, value: str) -> str:
    """`query_text` with tau2's one-field constraint, which it writes as `f'{{"{field}": "{value}"}}'` (a value with
    a quote is invalid JSON there too)."""
    return query_text(db, table, '{"' + field + '": "' + str(value) + '"}')


def found(text: str) -> bool:
    """Whether a `query_text` answer listed records (tau2's `"No records found" not in ...` tests)."""
    return "No records found" not in text and "No results found" not in text


def add(db: Any, table: str, record_id: str, record: dict) -> bool:
    """tau2's add_to_db: False when the id is taken or there is no such table (one tool names a table tau2 lacks)."""
    found_table = getattr(db, table, None)
    if found_table is None:
        return False
    data = found_table.data
    if record_id in data:
        return False
    data[record_id] = record
    return True


def update(db: Any, table: str, record_id: str, updates: dict) -> dict | None:
    """tau2's update_record_in_db: the updated record, or None when there is none with that id."""
    data = getattr(db, table).data
    if record_id not in data:
        return None
    data[record_id].update(updates)
    return data[record_id]


# ---- tau2's deterministic ids (utils.py) -------------------------------------------------------------------

def hex_id(seed: str, length: int = 16) -> str:
    return hashlib.sha256(seed.encode()).digest()[: length // 2].hex()


def transaction_id(user_id: str, card_type: str, merchant: str, amount: float, category: str) -> str:
    return "txn_" + hex_id(f"transaction:{user_id}:{card_type}:{merchant}:{amount:.2f}:{category}", 12)


def bank_transaction_id(account_id: str, day: str, description: str, amount: float, kind: str) -> str:
    return "btxn_" + hex_id(f"bank_txn:{account_id}:{day}:{description}:{amount:.2f}:{kind}", 12)


def dispute_id(user_id: str, txn_id: str) -> str:
    return "dsp_" + hex_id(f"dispute:{user_id}:{txn_id}", 12)


def verification_id(user_id: str, time_verified: str) -> str:
    return f"{user_id}_" + time_verified.replace(" ", "_").replace(":", "").replace("-", "")


def tool_record_id(side: str, tool_name: str) -> str:
    """tau2's generate_{user,agent}_discoverable_tool_id (side = "user" / "agent")."""
    return hex_id(f"{side}_discoverable_tool:{tool_name}")


def tool_call_record_id(tool_name: str, arguments: dict) -> str:
    return hex_id(f"user_discoverable_tool_call:{tool_name}:{json.dumps(arguments, sort_keys=True)}")


def balance(value: Any) -> float:
    """tau2's `_parse_balance`: a number, or text such as '$2,850.00'."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return float(value.replace("$", "").replace(",", ""))
    return 0.0


def account_balance(account: dict) -> float:
    """tau2's `_get_account_balance`: `current_holdings`, else `balance`."""
    return balance(account.get("current_holdings", account.get("balance", 0)))
