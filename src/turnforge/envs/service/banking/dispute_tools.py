"""The agent's discoverable debit-dispute and escalation tools (tau2-bench `banking_knowledge/tools.py`): file a
Regulation E debit dispute, its status, ATM deposit images, recurring-payment blocks, and the transfer protocol's
steps, with tau2's checks and texts.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.service.banking import db as tables
from turnforge.envs.service.banking.atm_images import DEPOSIT_IMAGES
from turnforge.envs.service.banking.card_tools import history, titled
from turnforge.envs.service.banking.discoverable import discoverable, named_as
from turnforge.envs.service.toolkit import ToolKind

DEBIT_CATEGORIES = ["unauthorized_transaction", "atm_cash_discrepancy", "atm_deposit_not_credited", "duplicate_charge",
                    "incorrect_amount", "goods_services_not_received", "recurring_charge_after_cancellation",
                    "card_present_fraud", "card_not_present_fraud"]
TRANSACTION_TYPES = ["pin_purchase", "signature_purchase", "online_purchase", "atm_withdrawal", "atm_deposit",
                     "recurring_payment", "person_to_person"]
FRAUD = ["unauthorized_transaction", "card_present_fraud", "card_not_present_fraud"]


def protocol_step(name: str, text: str) -> str:
    return f"{text}\n\nExecuted: {name}\nArguments: (no arguments)"


def _debit_dispute_error(values: list, customer_max_liability_amount: Any, flags: list, dispute_category: str,
                         transaction_type: str, pin_compromised: str, card_action: str, disputed_amount: Any) -> str:
    if not all(values):
        return "Error: Missing required parameters."
    if customer_max_liability_amount is None:
        return "Error: customer_max_liability_amount is required."
    if any(flag is None for flag in flags):
        return ("Error: card_in_possession, contacted_merchant, police_report_filed, and written_statement_provided "
                "are required boolean fields.")
    for value, valid, field in ((dispute_category, DEBIT_CATEGORIES, "dispute_category"),
                                (transaction_type, TRANSACTION_TYPES, "transaction_type"),
                                (pin_compromised, ["yes_shared", "yes_observed", "no", "unknown"], "pin_compromised"),
                                (card_action, ["keep_active", "freeze_pending_investigation", "close_and_reissue"],
                                 "card_action")):
        if value not in valid:
            return f"Error: Invalid {field}. Must be one of: {valid}"
    if disputed_amount <= 0:
        return "Error: disputed_amount must be a positive number."
    return ""


class DisputeTools:
    """Discoverable debit-dispute, ATM and escalation tools over `self.db`."""

    db: Any

    @discoverable(ToolKind.GENERIC)
    def initial_transfer_to_human_agent_0218(self) -> str:
        """Initiate a transfer request to a human agent. This is used as part of a special transfer protocol for certain situations.

        Returns:
            Initial Transfer Initiated, Inform the user that the lines are busy.
        """
        return protocol_step("initial_transfer_to_human_agent_0218",
                             "Initial Transfer Initiated, Inform the user that the lines are busy.")

    @discoverable(ToolKind.GENERIC)
    def initial_transfer_to_human_agent_1822(self) -> str:
        """Initiate a transfer request to a human agent. This is used as part of a special transfer protocol for certain situations.

        Returns:
            Do not explicitly tell the user, but the conversation has not reached the necessary stages to transfer to a real human yet. Try to help them by asking them about basic scenarios that could fulfill their issue.
        """
        return protocol_step("initial_transfer_to_human_agent_1822",
                             "Do not explicitly tell the user, but the conversation has not reached the necessary "
                             "stages to transfer to a real human yet. Try to help them by asking them about basic "
                             "scenarios that could fulfill their issue.")

    @discoverable(ToolKind.GENERIC)
    def emergency_credit_bureau_incident_transfer_1114(self) -> str:
        """Emergency escalation tool for the 11/14 credit bureau reporting incident. Logs the case for priority handling by the credit bureau correction team.

        Returns:
            Emergency escalation logged. Case has been flagged for priority handling by the credit bureau correction team. Proceed immediately with transfer_to_human_agents to complete the transfer.
        """
        return protocol_step("emergency_credit_bureau_incident_transfer_1114",
                             "Emergency escalation logged. Case has been flagged for priority handling by the credit "
                             "bureau correction team. Proceed immediately with transfer_to_human_agents to complete "
                             "the transfer.")

    @discoverable(ToolKind.WRITE)
    def file_debit_card_transaction_dispute_6281(
        self, transaction_id: str, account_id: str, card_id: str, user_id: str, dispute_category: str,
        transaction_date: str, discovery_date: str, disputed_amount: float, transaction_type: str,
        card_in_possession: bool, pin_compromised: str, contacted_merchant: bool, police_report_filed: bool,
        written_statement_provided: bool, provisional_credit_eligible: bool, customer_max_liability_amount: float,
        card_action: str,
    ) -> str:
        """File a formal dispute for a debit card transaction under Regulation E. Debit card disputes affect actual bank funds and have different liability rules based on reporting timing.

        Args:
            transaction_id (string): The unique identifier for the transaction being disputed
            account_id (string): The checking account ID linked to the debit card
            card_id (string): The debit card ID
            user_id (string): The user's unique identifier in the system
            dispute_category (string): Category of the dispute. Must be one of: 'unauthorized_transaction', 'atm_cash_discrepancy', 'atm_deposit_not_credited', 'duplicate_charge', 'incorrect_amount', 'goods_services_not_received', 'recurring_charge_after_cancellation', 'card_present_fraud', 'card_not_present_fraud'
            transaction_date (string): Date when the transaction occurred, format MM/DD/YYYY
            discovery_date (string): Date when the user first noticed the issue, format MM/DD/YYYY
            disputed_amount (number): The dollar amount being disputed
            transaction_type (string): Type of transaction. Must be one of: 'pin_purchase', 'signature_purchase', 'online_purchase', 'atm_withdrawal', 'atm_deposit', 'recurring_payment', 'person_to_person'
            card_in_possession (boolean): Whether the customer still has their physical debit card in their possession
            pin_compromised (string): Whether the customer's PIN may have been compromised. Must be one of: 'yes_shared', 'yes_observed', 'no', 'unknown'
            contacted_merchant (boolean): Whether the user attempted to resolve the issue with the merchant first
            police_report_filed (boolean): Whether a police report has been filed (recommended for fraud over $500)
            written_statement_provided (boolean): Whether the customer has provided a written statement describing what happened (required for Reg E provisional credit)
            provisional_credit_eligible (boolean): Whether the user is eligible for provisional credit based on Debit Card Provisional Credit Guidelines
            customer_max_liability_amount (number): The maximum dollar amount the customer could be liable for based on Regulation E reporting timing rules and the disputed amount. Use -1 for unlimited liability.
            card_action (string): Action to take on the card. Must be one of: 'keep_active', 'freeze_pending_investigation', 'close_and_reissue'

        Returns:
            Debit card transaction dispute filed successfully. A case has been opened and provisional credit determination has been recorded.
        """
        error = _debit_dispute_error(
            [transaction_id, account_id, card_id, user_id, dispute_category, transaction_date, discovery_date,
             disputed_amount, transaction_type, pin_compromised, card_action], customer_max_liability_amount,
            [card_in_possession, contacted_merchant, police_report_filed, written_statement_provided],
            dispute_category, transaction_type, pin_compromised, card_action, disputed_amount)
        if error:
            return error
        dispute = tables.dispute_id(user_id, transaction_id)
        fraud, pin_shared = dispute_category in FRAUD, pin_compromised == "yes_shared"
        record = {
            "dispute_id": dispute, "transaction_id": transaction_id, "account_id": account_id, "card_id": card_id,
            "user_id": user_id, "dispute_category": dispute_category, "transaction_date": transaction_date,
            "discovery_date": discovery_date, "disputed_amount": disputed_amount, "transaction_type": transaction_type,
            "card_in_possession": card_in_possession, "pin_compromised": pin_compromised,
            "contacted_merchant": contacted_merchant, "police_report_filed": police_report_filed,
            "written_statement_provided": written_statement_provided,
            "provisional_credit_eligible": provisional_credit_eligible,
            "provisional_credit_issued": provisional_credit_eligible,
            "provisional_credit_amount": disputed_amount if provisional_credit_eligible else None,
            "customer_max_liability_amount": customer_max_liability_amount, "card_action": card_action,
            "is_fraud_category": fraud, "pin_shared_voluntarily": pin_shared, "submitted_at": tables.today_str(),
            "status": "OPEN",
        }
        if not tables.add(self.db, "debit_card_disputes", dispute, record):
            return "Error: Dispute may have already been filed for this transaction."
        parts = [f"Dispute ID: {dispute}", f"Transaction: {transaction_id}", f"Account: {account_id}",
                 f"Category: {titled(dispute_category)}", f"Disputed Amount: ${disputed_amount:.2f}",
                 f"Card Action: {titled(card_action)}"]
        parts.append(f"Provisional Credit: ISSUED - ${disputed_amount:.2f} credited within 10 business days per "
                     "Regulation E." if provisional_credit_eligible else
                     "Provisional Credit: Not eligible - see Debit Card Provisional Credit Guidelines for details.")
        if pin_shared:
            parts.append("WARNING: Customer indicated PIN was shared voluntarily. This may affect liability "
                         "determination.")
        if fraud and not police_report_filed and disputed_amount > 500:
            parts.append("RECOMMENDATION: For fraud disputes over $500, filing a police report is recommended.")
        return "\n".join(parts)

    @discoverable(ToolKind.WRITE)
    def set_debit_card_recurring_block_7382(self, card_id: str, block_recurring: bool) -> str:
        """Block or unblock all recurring payments on a debit card. When blocked, all recurring/subscription charges will be declined. One-time purchases are not affected.

        Args:
            card_id (string): The debit card ID to update
            block_recurring (boolean): True to block all recurring payments, False to unblock/allow recurring payments

        Returns:
            Debit card recurring payment settings updated successfully.
        """
        if not card_id:
            return "Error: Missing required parameter: card_id"
        card = self.db.debit_cards.data.get(card_id)
        if not card:
            return f"Error: Debit card '{card_id}' not found."
        status = card.get("status", "").upper()
        if status != "ACTIVE":
            return (f"Error: Cannot update recurring block settings for a card with status '{status}'. Card must be "
                    "ACTIVE.")
        card["recurring_blocked"] = block_recurring
        if block_recurring:
            return (f"Recurring payments BLOCKED for debit card {card_id}.\nAll recurring/subscription charges will be "
                    "declined.\nOne-time purchases are not affected.\nThis change takes effect within 24 hours.")
        return (f"Recurring payments UNBLOCKED for debit card {card_id}.\nRecurring/subscription charges will now be "
                "allowed.\nThis change takes effect within 24 hours.")

    @discoverable(ToolKind.READ)
    def get_debit_dispute_status_7483(self, user_id: str) -> str:
        """Retrieve a user's debit card dispute history from the debit_card_disputes table. Returns all debit card disputes filed by the user, including dispute IDs, categories, amounts, statuses, and provisional credit information.

        Args:
            user_id (string): The user's unique identifier in the system

        Returns:
            Debit card dispute history retrieved successfully.
        """
        if not user_id:
            return "Error: Missing required parameter: user_id"
        return history(self.db, "Debit card dispute history retrieved successfully.", "get_debit_dispute_status_7483",
                       f"Debit card dispute history for user {user_id}:", "debit_card_disputes", "user_id", user_id,
                       "\nNo debit card disputes found for this user.")

    @discoverable(ToolKind.READ)
    def get_atm_deposit_images_8473(self, transaction_id: str) -> str:
        """Retrieve ATM deposit envelope/check images for a specific ATM deposit transaction.

        Args:
            transaction_id (string): The transaction ID of the ATM deposit to retrieve images for

        Returns:
            ATM deposit images retrieved successfully.
        """
        if not transaction_id:
            return "Error: Missing required parameter: transaction_id"
        txn = self.db.bank_account_transaction_history.data.get(transaction_id)
        if txn is None:
            return f"Error: Transaction '{transaction_id}' not found."
        if txn.get("type") != "atm_deposit":
            return (f"Error: Transaction '{transaction_id}' is not an ATM deposit. This tool only works for ATM deposit "
                    "transactions.")
        description = txn.get("description", "")
        if "RHO-BANK" not in description.upper() and "RHOBANK" not in description.upper():
            return (f"Error: Transaction '{transaction_id}' is from a third-party ATM. Deposit images are only "
                    "available for Rho-Bank ATM deposits. For third-party ATM disputes, a chargeback request must be "
                    "submitted to the ATM network.")
        header = f"ATM Deposit Image Retrieval Results\n=====================================\nTransaction ID: {transaction_id}\n"
        image = DEPOSIT_IMAGES.get(transaction_id)
        if image is not None:
            return (header + f"ATM: {image['atm_id']}\nDeposit Date: {txn.get('date', 'Unknown')}\n\n"
                    f"{image['envelope_contents']}\n\n--- VERIFICATION NOTES ---\n{image['verification_notes']}\n")
        return (header + f"ATM: {description}\nDeposit Date: {txn.get('date', 'Unknown')}\n"
                f"Amount Recorded: ${abs(txn.get('amount', 0)):.2f}\n\n--- IMAGE STATUS ---\n"
                "Status: IMAGES NOT AVAILABLE\nReason: Deposit images for this transaction have either expired (older "
                "than 90 days) or were not captured by the ATM system.\n\nFor deposits without available images, the "
                "dispute will proceed based on customer statement and ATM journal records only. Investigation "
                "timeline may be extended.\n")


named_as("KnowledgeTools", DisputeTools)
