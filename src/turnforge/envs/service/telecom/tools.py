"""The telecom agent toolkit: tau2-bench's 13 agent tools (`domains/telecom/tools.py`) with the same names,
arguments, effects and error strings, plus the functions tasks call outside the conversation: the setup ones
of `initial_state.initialization_actions` (`set_data_usage`, `suspend_line_for_overdue_bill`) and the
`env_assertions` checks (`assert_*`), which are plain methods, not tools.

Departure: a refuel on a customer with no draft bill opens one; tau2 names it `B` + 8 random hex digits, which
makes its own DB check differ from the gold run whenever that happens; here the id is derived from the customer
and the bill count, so the same actions give the same DB. Today is 2025-02-25, as tau2 fixes it.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from turnforge.envs.service.telecom.db import (
    Bill,
    BillStatus,
    Customer,
    Device,
    Line,
    LineItem,
    LineStatus,
    Plan,
)
from turnforge.envs.service.toolkit import ToolKind, Toolkit, tool

TODAY = datetime.date(2025, 2, 25)  # tau2 telecom utils.get_today


def _first_of_next_month(day: datetime.date) -> datetime.date:
    return (day.replace(day=1) + datetime.timedelta(days=32)).replace(day=1)


class TelecomTools(Toolkit):
    """The agent's tools over the telecom DB."""

    # ---- look-ups (tau2's helpers; their errors are the tools' errors) --------------------------------------
    def _find(self, records: list, field: str, value: str, what: str) -> Any:
        for record in records:
            if getattr(record, field) == value:
                return record
        raise ValueError(f"{what} with ID {value} not found")

    def _line(self, line_id: str) -> Line:
        return self._find(self.db.lines, "line_id", line_id, "Line")

    def line_by_phone(self, phone_number: str) -> Line:
        for line in self.db.lines:
            if line.phone_number == phone_number:
                return line
        raise ValueError(f"Line with phone number {phone_number} not found")

    def plan(self, plan_id: str) -> Plan:
        return self._find(self.db.plans, "plan_id", plan_id, "Plan")

    def _device(self, device_id: str) -> Device:
        return self._find(self.db.devices, "device_id", device_id, "Device")

    def _bill(self, bill_id: str) -> Bill:
        return self._find(self.db.bills, "bill_id", bill_id, "Bill")

    def _customer_line(self, customer_id: str, line_id: str) -> Line:
        customer = self.get_customer_by_id(customer_id)
        if line_id not in customer.line_ids:
            raise ValueError(f"Line {line_id} not found for customer {customer_id}")
        return self._line(line_id)

    def bills_awaiting_payment(self, customer: Customer) -> list[Bill]:
        return [b for b in map(self._bill, customer.bill_ids) if b.status == BillStatus.AWAITING_PAYMENT]

    def set_bill_paid(self, bill_id: str) -> None:
        self._bill(bill_id).status = BillStatus.PAID

    # ---- tools ----------------------------------------------------------------------------------------------
    @tool(ToolKind.READ)
    def get_customer_by_phone(self, phone_number: str) -> Customer:
        """Finds a customer by their primary contact or line phone number.

        Args:
            phone_number: The phone number to search for.

        Returns:
            Customer object if found, None otherwise.
        """
        for customer in self.db.customers:
            if customer.phone_number == phone_number:
                return customer
            if any(line.phone_number == phone_number for line in map(self._line, customer.line_ids)):
                return customer
        raise ValueError(f"Customer with phone number {phone_number} not found")

    @tool(ToolKind.READ)
    def get_customer_by_id(self, customer_id: str) -> Customer:
        """Retrieves a customer directly by their unique ID.

        Args:
            customer_id: The unique identifier of the customer.

        Returns:
            Customer object if found, None otherwise.
        """
        for customer in self.db.customers:
            if customer.customer_id == customer_id:
                return customer
        raise ValueError(f"Customer with ID {customer_id} not found")

    @tool(ToolKind.READ)
    def get_customer_by_name(self, full_name: str, dob: str) -> list[Customer]:
        """Searches for customers by name and DOB. May return multiple matches if names are similar,
        DOB helps disambiguate.

        Args:
            full_name: The full name of the customer.
            dob: Date of birth for verification, in the format YYYY-MM-DD.

        Returns:
            List of matching Customer objects.
        """
        return [c for c in self.db.customers if c.full_name.lower() == full_name.lower() and c.date_of_birth == dob]

    @tool(ToolKind.READ)
    def get_details_by_id(self, id: str) -> dict[str, Any]:
        """Retrieves the details for a given ID.
        The ID must be a valid ID for a Customer, Line, Device, Bill, or Plan.

        Args:
            id: The ID of the object to retrieve.

        Returns:
            The object corresponding to the ID.

        Raises:
            ValueError: If the ID is not found or if the ID format is invalid.
        """
        by_prefix = {"L": self._line, "D": self._device, "B": self._bill, "C": self.get_customer_by_id, "P": self.plan}
        if id[:1] not in by_prefix:
            raise ValueError(f"Unknown ID format or type: {id}")
        return by_prefix[id[:1]](id)

    @tool(ToolKind.WRITE)
    def suspend_line(self, customer_id: str, line_id: str, reason: str) -> dict[str, Any]:
        """Suspends a specific line (max 6 months).
        Checks: Line status must be Active.
        Logic: Sets line status to Suspended, records suspension_start_date.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to suspend.
            reason: Reason for suspension.

        Returns:
            Dictionary with success status, message, and updated line if applicable.

        Raises:
            ValueError: If customer or line not found, or if line is not active.
        """
        line = self._customer_line(customer_id, line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend")
        line.status, line.suspension_start_date = LineStatus.SUSPENDED, TODAY
        return {"message": "Line suspended successfully. $5/month holding fee will apply.", "line": line}

    @tool(ToolKind.WRITE)
    def resume_line(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """Resumes a suspended line.
        Checks: Line status must be Suspended or Pending Activation.
        Logic: Sets line status to Active, clears suspension_start_date.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to resume.

        Returns:
            Dictionary with success status, message, and updated line if applicable.

        Raises:
            ValueError: If customer or line not found, or if line is not suspended or pending activation.
        """
        line = self._customer_line(customer_id, line_id)
        if line.status not in (LineStatus.SUSPENDED, LineStatus.PENDING_ACTIVATION):
            raise ValueError("Line must be suspended to resume")
        line.status, line.suspension_start_date = LineStatus.ACTIVE, None
        return {"message": "Line resumed successfully", "line": line}

    @tool(ToolKind.READ)
    def get_bills_for_customer(self, customer_id: str, limit: int = 12) -> list[Bill]:
        """Retrieves a list of the customer's bills, most recent first.

        Args:
            customer_id: ID of the customer.
            limit: Maximum number of bills to return.

        Returns:
            List of Bill objects, ordered by issue date (newest first).

        Raises:
            ValueError: If the customer is not found.
        """
        customer = self.get_customer_by_id(customer_id)
        bills = sorted(map(self._bill, customer.bill_ids), key=lambda b: b.issue_date, reverse=True)
        return bills[:limit]

    @tool(ToolKind.WRITE)
    def send_payment_request(self, customer_id: str, bill_id: str) -> str:
        """Sends a payment request to the customer for a specific bill.
        Checks:
            - Customer exists
            - Bill exists and belongs to the customer
            - No other bills are already awaiting payment for this customer
        Logic: Sets bill status to AWAITING_PAYMENT and notifies customer.
        Warning: This method does not check if the bill is already PAID.
        Always check the bill status before calling this method.

        Args:
            customer_id: ID of the customer who owns the bill.
            bill_id: ID of the bill to send payment request for.

        Returns:
            Message indicating the payment request has been sent.

        Raises:
            ValueError: If customer not found, bill not found, or if another bill is already awaiting payment.
        """
        customer = self.get_customer_by_id(customer_id)
        if self.bills_awaiting_payment(customer):
            raise ValueError("A bill is already awaiting payment for this customer")
        if bill_id not in customer.bill_ids:
            raise ValueError(f"Bill {bill_id} not found for customer {customer_id}")
        bill = self._bill(bill_id)
        bill.status = BillStatus.AWAITING_PAYMENT
        return f"Payment request sent to the customer for bill {bill.bill_id}"

    @tool(ToolKind.READ)
    def get_data_usage(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """Retrieves current billing cycle data usage for a line, including data
        refueling amount, data limit, and cycle end date.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to check usage for.

        Returns:
            Dictionary with usage information.

        Raises:
            ValueError: If customer, line, or plan not found.
        """
        line = self._customer_line(customer_id, line_id)
        plan = self.plan(line.plan_id)
        return {"line_id": line_id, "data_used_gb": line.data_used_gb, "data_limit_gb": plan.data_limit_gb,
                "data_refueling_gb": line.data_refueling_gb,
                "cycle_end_date": _first_of_next_month(TODAY) - datetime.timedelta(days=1)}

    @tool(ToolKind.WRITE)
    def enable_roaming(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """Enables international roaming on a line.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to enable roaming for.

        Returns:
            Message indicating the roaming has been enabled.

        Raises:
            ValueError: If customer or line not found.
        """
        line = self._customer_line(customer_id, line_id)
        if line.roaming_enabled:
            return "Roaming was already enabled"
        line.roaming_enabled = True
        return "Roaming enabled successfully"

    @tool(ToolKind.WRITE)
    def disable_roaming(self, customer_id: str, line_id: str) -> str:
        """Disables international roaming on a line.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to disable roaming for.

        Returns:
            Message indicating the roaming has been enabled.

        Raises:
            ValueError: If customer or line not found.
        """
        line = self._customer_line(customer_id, line_id)
        if not line.roaming_enabled:
            return "Roaming was already disabled"
        line.roaming_enabled = False
        return "Roaming disabled successfully"

    @tool(ToolKind.GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of the user's issue.
        Only transfer if
         -  the user explicitly asks for a human agent
         -  given the policy and the available tools, you cannot solve the user's issue.

        Args:
            summary: A summary of the user's issue.

        Returns:
            A message indicating the user has been transferred to a human agent.
        """
        return "Transfer successful"

    @tool(ToolKind.WRITE)
    def refuel_data(self, customer_id: str, line_id: str, gb_amount: float) -> dict[str, Any]:
        """Refuels data for a specific line, adding to the customer's bill.
        Checks: Line status must be Active, Customer owns the line.
        Logic: Adds data to the line and charges customer based on the plan's refueling rate.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to refuel data for.
            gb_amount: Amount of data to add in gigabytes.

        Returns:
            Dictionary with success status, message, charge amount, and updated line if applicable.

        Raises:
            ValueError: If customer, line, or plan not found, or if checks fail.
        """
        line = self._customer_line(customer_id, line_id)  # tau2 does not check that the line is active
        if gb_amount <= 0:
            raise ValueError("Refuel amount must be positive")
        plan = self.plan(line.plan_id)
        charge = gb_amount * plan.data_refueling_price_per_gb
        line.data_refueling_gb += gb_amount
        self._charge(customer_id, charge, f"Data refueling: {gb_amount} GB at ${plan.data_refueling_price_per_gb}/GB")
        return {"message": f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
                "new_data_refueling_gb": line.data_refueling_gb, "charge": charge}

    def _charge(self, customer_id: str, amount: float, description: str) -> None:
        """Add a charge (or a credit, < 0) to the customer's draft bill, opening one for next month if none."""
        customer = self.get_customer_by_id(customer_id)
        draft = next((b for b in map(self._bill, customer.bill_ids) if b.status == BillStatus.DRAFT), None)
        if draft is None:
            start = _first_of_next_month(TODAY)
            bill_id = "B" + hashlib.sha256(f"{customer_id}:{len(self.db.bills)}".encode()).hexdigest()[:8]
            draft = Bill(bill_id=bill_id, customer_id=customer_id, period_start=start,
                         period_end=_first_of_next_month(start) - datetime.timedelta(days=1), issue_date=start,
                         total_due=0, due_date=start + datetime.timedelta(days=14), status=BillStatus.DRAFT)
            self.db.bills.append(draft)
            customer.bill_ids.append(bill_id)
        draft.line_items.append(LineItem(description=description, amount=amount, date=TODAY,
                                         item_type="Credit" if amount < 0 else "Charge"))
        draft.total_due += amount

    # ---- task setup (initialization_actions) ----------------------------------------------------------------
    def set_data_usage(self, customer_id: str, line_id: str, data_used_gb: float) -> str:
        self._customer_line(customer_id, line_id).data_used_gb = data_used_gb
        return f"Data usage set to {data_used_gb} GB for line {line_id}"

    def suspend_line_for_overdue_bill(self, customer_id: str, line_id: str, new_bill_id: str,
                                      contract_ended: bool) -> str:
        """Suspend an active line for an overdue bill of last month's plan price."""
        line = self._line(line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend for unpaid bill")
        amount = self.plan(line.plan_id).price_per_month
        if amount <= 0:
            raise ValueError("Amount must be positive for overdue bill")
        customer = self.get_customer_by_id(customer_id)
        if any(self._bill(b).status == BillStatus.OVERDUE for b in customer.bill_ids):
            raise ValueError("Customer already has an overdue bill")
        last_day = TODAY.replace(day=1) - datetime.timedelta(days=1)
        first_day = last_day.replace(day=1)
        item = LineItem(description=f"Charge for line {line.line_id}", amount=amount, date=TODAY, item_type="Charge")
        self.db.bills.append(Bill(bill_id=new_bill_id, customer_id=customer_id, period_start=first_day,
                                  period_end=last_day, issue_date=first_day, total_due=amount,
                                  due_date=first_day + datetime.timedelta(days=14), line_items=[item],
                                  status=BillStatus.OVERDUE))
        customer.bill_ids.append(new_bill_id)
        line.status, line.suspension_start_date = LineStatus.SUSPENDED, TODAY
        if contract_ended:
            line.contract_end_date = last_day
        return f"Line {line_id} suspended for unpaid bill {new_bill_id}. Contract ended: {contract_ended}"

    # ---- env assertions --------------------------------------------------------------------------------------
    def assert_data_refueling_amount(self, customer_id: str, line_id: str, expected_amount: float) -> bool:
        return abs(self._customer_line(customer_id, line_id).data_refueling_gb - expected_amount) < 1e-6

    def assert_line_status(self, customer_id: str, line_id: str, expected_status: str) -> bool:
        return self._customer_line(customer_id, line_id).status == expected_status

    def assert_overdue_bill_exists(self, customer_id: str, overdue_bill_id: str) -> bool:
        if overdue_bill_id not in self.get_customer_by_id(customer_id).bill_ids:
            raise ValueError(f"Overdue bill {overdue_bill_id} not found")
        if self._bill(overdue_bill_id).status != BillStatus.OVERDUE:
            raise ValueError(f"Overdue bill {overdue_bill_id} is not overdue")
        return True

    def assert_no_overdue_bill(self, overdue_bill_id: str) -> bool:
        """The bill is gone or paid."""
        try:
            return self._bill(overdue_bill_id).status == BillStatus.PAID
        except ValueError:
            return True
