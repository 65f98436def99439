"""Airline tools against tau2's airline DB: each tool's success path and main error paths, with tau2's strings."""

from __future__ import annotations

from pathlib import Path

import pytest

from service_calls import err, ok
from turnforge.envs.service.domain import load_domain

TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
pytestmark = pytest.mark.skipif(not (TAU2 / "airline" / "db.json").is_file(), reason="../shared/data/tau2 absent")

EMMA = "emma_kim_9957"  # credit_card_5832574, gift_card_9562694 (103); EHGLP3: 2 passengers, basic economy
MIA = "mia_li_3668"  # certificates 100 and 250
PAX = [{"first_name": "Emma", "last_name": "Kim", "dob": "1990-01-01"}]


@pytest.fixture()
def tools():
    domain = load_domain("airline", str(TAU2 / "airline"))
    return domain.toolkit(domain.new_db())


def test_fourteen_tools():
    assert len(load_domain("airline", str(TAU2 / "airline")).tool_kinds()) == 14


def test_reads(tools):
    assert ok(tools, "get_user_details", user_id=EMMA)["membership"] == "gold"
    assert err(tools, "get_user_details", user_id="x") == "Error: User x not found"
    assert ok(tools, "get_reservation_details", reservation_id="EHGLP3")["cabin"] == "basic_economy"
    assert err(tools, "get_reservation_details", reservation_id="NOPE") == "Error: Reservation NOPE not found"
    assert ok(tools, "get_flight_status", flight_number="HAT014", date="2024-05-15") == "delayed"
    assert err(tools, "get_flight_status", flight_number="HAT999", date="2024-05-15") == "Error: Flight HAT999 not found"
    assert err(tools, "get_flight_status", flight_number="HAT014", date="2024-06-01") == \
        "Error: Flight HAT014 not found on date 2024-06-01"
    airports = ok(tools, "list_all_airports")
    assert len(airports) == 20 and airports[0] == {"iata": "SFO", "city": "San Francisco"}
    assert tools.call("calculate", {"expression": "2 * (3 + 4)"}).content == "14.0"
    assert ok(tools, "transfer_to_human_agents", summary="s") == "Transfer successful"


def test_searches(tools):
    direct = ok(tools, "search_direct_flight", origin="JFK", destination="MIA", date="2024-05-20")
    assert "HAT014" in [f["flight_number"] for f in direct] and direct[0]["date"] is None
    assert all(f["origin"] == "JFK" and f["destination"] == "MIA" for f in direct)
    assert ok(tools, "search_direct_flight", origin="JFK", destination="MIA", date="2024-05-15") == []  # delayed
    onestop = ok(tools, "search_onestop_flight", origin="PHX", destination="JFK", date="2024-05-17")
    assert onestop and all(a["destination"] == b["origin"] and b["destination"] == "JFK" for a, b in onestop)
    assert all(a["date"] == "2024-05-17" for a, _ in onestop)


def test_book_reservation(tools):
    args = dict(user_id=EMMA, origin="JFK", destination="MIA", flight_type="one_way", cabin="economy",
                flights=[{"flight_number": "HAT014", "date": "2024-05-20"}], passengers=PAX,
                payment_methods=[{"payment_id": "credit_card_5832574", "amount": 143 + 30 + 50}],
                total_baggages=2, nonfree_baggages=1, insurance="yes")
    assert err(tools, "book_reservation", **{**args, "payment_methods": [{"payment_id": "credit_card_5832574",
                                                                           "amount": 100}]}) == \
        "Error: Payment amount does not add up, total price is 223, but paid 100"
    assert err(tools, "book_reservation", **{**args, "payment_methods": [{"payment_id": "gift_card_9562694",
                                                                           "amount": 223}]}) == \
        "Error: Not enough balance in payment method gift_card_9562694"
    assert err(tools, "book_reservation", **{**args, "flights": [{"flight_number": "HAT014", "date": "2024-05-15"}]}) \
        == "Error: Flight HAT014 not available on date 2024-05-15"
    assert err(tools, "book_reservation", **{**args, "cabin": "economy", "flights": [
        {"flight_number": "HAT014", "date": "2024-05-18"}]}) == "Error: Not enough seats on flight HAT014"
    assert err(tools, "book_reservation", **{**args, "user_id": "x"}) == "Error: User x not found"
    reservation = ok(tools, "book_reservation", **args)
    assert reservation["reservation_id"] == "HATHAT" and reservation["created_at"] == "2024-05-15T15:00:00"
    assert tools.db.flights["HAT014"].dates["2024-05-20"].available_seats["economy"] == 8
    assert "HATHAT" in tools.db.users[EMMA].reservations
    assert ok(tools, "book_reservation", **args)["reservation_id"] == "HATHAU"


def test_book_with_a_certificate_removes_it(tools):
    ok(tools, "book_reservation", user_id=MIA, origin="JFK", destination="MIA", flight_type="one_way",
       cabin="basic_economy", flights=[{"flight_number": "HAT014", "date": "2024-05-20"}], passengers=PAX,
       payment_methods=[{"payment_id": "certificate_4856383", "amount": 57}], total_baggages=0, nonfree_baggages=0,
       insurance="no")
    assert "certificate_4856383" not in tools.db.users[MIA].payment_methods


def test_cancel_reservation(tools):
    reservation = ok(tools, "cancel_reservation", reservation_id="EHGLP3")
    assert reservation["status"] == "cancelled"
    assert reservation["payment_history"][-1] == {"payment_id": "credit_card_5832574", "amount": -208}
    assert err(tools, "cancel_reservation", reservation_id="NOPE") == "Error: Reservation NOPE not found"


def test_update_baggages(tools):
    assert err(tools, "update_reservation_baggages", reservation_id="EHGLP3", total_baggages=2, nonfree_baggages=2,
               payment_id="certificate_1") == "Error: Payment method not found"
    reservation = ok(tools, "update_reservation_baggages", reservation_id="EHGLP3", total_baggages=2,
                     nonfree_baggages=2, payment_id="gift_card_9562694")
    assert reservation["payment_history"][-1] == {"payment_id": "gift_card_9562694", "amount": 100}
    assert tools.db.users[EMMA].payment_methods["gift_card_9562694"].amount == 3
    assert err(tools, "update_reservation_baggages", reservation_id="EHGLP3", total_baggages=3, nonfree_baggages=3,
               payment_id="gift_card_9562694") == "Error: Gift card balance is not enough"


def test_update_flights(tools):
    flights = [{"flight_number": "HAT045", "date": "2024-05-17"}, {"flight_number": "HAT021", "date": "2024-05-17"}]
    reservation = ok(tools, "update_reservation_flights", reservation_id="EHGLP3", cabin="basic_economy",
                     flights=flights, payment_id="credit_card_5832574")
    assert [f["flight_number"] for f in reservation["flights"]] == ["HAT045", "HAT021"]
    assert reservation["payment_history"][-1] == {"payment_id": "credit_card_5832574", "amount": (63 - 50) * 2}
    assert err(tools, "update_reservation_flights", reservation_id="EHGLP3", cabin="economy", flights=flights,
               payment_id="certificate_x") == "Error: Payment method not found"
    mia = ok(tools, "get_user_details", user_id=MIA)["reservations"][0]
    assert err(tools, "update_reservation_flights", reservation_id=mia, cabin="business", flights=flights,
               payment_id="certificate_4856383") in (
        "Error: Certificate cannot be used to update reservation", "Error: Not enough seats on flight HAT045")


def test_update_passengers_and_send_certificate(tools):
    two = PAX + [{"first_name": "Ann", "last_name": "Lee", "dob": "1980-02-02"}]
    assert err(tools, "update_reservation_passengers", reservation_id="EHGLP3", passengers=PAX) == \
        "Error: Number of passengers does not match"
    assert ok(tools, "update_reservation_passengers", reservation_id="EHGLP3", passengers=two)["passengers"][1]["first_name"] == "Ann"
    assert ok(tools, "send_certificate", user_id=EMMA, amount=50) == \
        f"Certificate certificate_3221322 added to user {EMMA} with amount 50."
    assert tools.db.users[EMMA].payment_methods["certificate_3221322"].amount == 50
    assert err(tools, "send_certificate", user_id="x", amount=50) == "Error: User x not found"
