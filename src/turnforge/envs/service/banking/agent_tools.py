"""All the agent's discoverable tools of banking_knowledge, one class (tau2 defines them on KnowledgeTools)."""

from __future__ import annotations

from turnforge.envs.service.banking.account_tools import AccountTools
from turnforge.envs.service.banking.card_tools import CreditCardTools
from turnforge.envs.service.banking.credit_limit_tools import CreditLimitTools
from turnforge.envs.service.banking.debit_tools import DebitCardTools
from turnforge.envs.service.banking.dispute_tools import DisputeTools


class AgentDiscoverableTools(CreditCardTools, CreditLimitTools, AccountTools, DebitCardTools, DisputeTools):
    """The tools the agent unlocks from the knowledge base."""
