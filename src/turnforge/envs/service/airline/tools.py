"""The airline toolkit: tau2-bench's 14 agent tools (`domains/airline/tools.py`), same names, arguments,
effects on the DB and error strings (and tau2's quirks: fixed "now", new ids HATHAT/HATHAU/HATHAV and
certificate_3221322.., no seat release on cancel or flight change). Tool descriptions are tau2's (MIT,
(c) 2025 Sierra Research): the agent must see the benchmark's own schemas.
"""

from __future__ import annotations

from copy import deepcopy

from turnforge.envs.service.airline.db import (
    AirportCode,
    CabinClass,
    Certificate,
    DirectFlight,
    Flight,
    FlightDateStatusAvailable,
    FlightInfo,
    FlightType,
    Insurance,
    Passenger,
    Payment,
    Reservation,
    ReservationFlight,
    User,
)
from turnforge.envs.service.toolkit import ToolKind, Toolkit, tool
from turnforge.envs.service.tools_common import calculate_expression

NOW = "2024-05-15T15:00:00"  # tau2's AirlineTools._get_datetime
AIRPORTS = [
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"), ("DFW", "Dallas"),
    ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"), ("BOS", "Boston"),
    ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"), ("EWR", "Newark"),
    ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"), ("PHL", "Philadelphia"), ("LGA", "LaGuardia"),
]
_PAYMENT_ID = ("The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', "
               "'certificate_7815826'.")


def _models(values: list, model: type) -> list:
    """tau2 converts a list of dicts to models only when every element is a dict."""
    if all(isinstance(v, dict) for v in values):
        return [model(**v) for v in values]
    return values


class AirlineTools(Toolkit):
    """All the tools for the airline domain."""

    def _user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ValueError(f"User {user_id} not found")
        return self.db.users[user_id]

    def _reservation(self, reservation_id: str) -> Reservation:
        if reservation_id not in self.db.reservations:
            raise ValueError(f"Reservation {reservation_id} not found")
        return self.db.reservations[reservation_id]

    def _flight(self, flight_number: str) -> Flight:
        if flight_number not in self.db.flights:
            raise ValueError(f"Flight {flight_number} not found")
        return self.db.flights[flight_number]

    def _flight_instance(self, flight_number: str, date: str):
        flight = self._flight(flight_number)
        if date not in flight.dates:
            raise ValueError(f"Flight {flight_number} not found on date {date}")
        return flight.dates[date]

    def _search(self, date: str, origin: str | None, destination: str | None, leave_after: str | None = None):
        results = []
        for flight in self.db.flights.values():  # read only: no copy
            status = flight.dates.get(date)
            if ((origin is None or flight.origin == origin) and (destination is None or flight.destination == destination)
                    and status is not None and status.status == "available"
                    and (leave_after is None or flight.scheduled_departure_time_est >= leave_after)):
                results.append(DirectFlight(
                    flight_number=flight.flight_number, origin=flight.origin, destination=flight.destination,
                    status="available", scheduled_departure_time_est=flight.scheduled_departure_time_est,
                    scheduled_arrival_time_est=flight.scheduled_arrival_time_est,
                    available_seats=status.available_seats, prices=status.prices,
                ))
        return results

    def _payment_for_update(self, user: User, payment_id: str, total_price: int) -> Payment | None:
        if payment_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        method = user.payment_methods[payment_id]
        if method.source == "certificate":
            raise ValueError("Certificate cannot be used to update reservation")
        if method.source == "gift_card" and method.amount < total_price:
            raise ValueError("Gift card balance is not enough")
        if method.source == "gift_card":
            method.amount -= total_price
        return Payment(payment_id=payment_id, amount=total_price) if total_price != 0 else None

    @tool(ToolKind.WRITE)
    def book_reservation(
        self,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: FlightType,
        cabin: CabinClass,
        flights: list[FlightInfo | dict],
        passengers: list[Passenger | dict],
        payment_methods: list[Payment | dict],
        total_baggages: int,
        nonfree_baggages: int,
        insurance: Insurance,
    ) -> Reservation:
        """Book a reservation.

        Args:
            user_id: The ID of the user to book the reservation such as 'sara_doe_496'`.
            origin: The IATA code for the origin city such as 'SFO'.
            destination: The IATA code for the destination city such as 'JFK'.
            flight_type: The type of flight such as 'one_way' or 'round_trip'.
            cabin: The cabin class such as 'basic_economy', 'economy', or 'business'.
            flights: An array of objects containing details about each piece of flight.
            passengers: An array of objects containing details about each passenger.
            payment_methods: An array of objects containing details about each payment method.
            total_baggages: The total number of baggage items to book the reservation.
            nonfree_baggages: The number of non-free baggage items to book the reservation.
            insurance: Whether the reservation has insurance.
        """
        flights = _models(flights, FlightInfo)
        passengers = _models(passengers, Passenger)
        payment_methods = _models(payment_methods, Payment)
        user = self._user(user_id)
        reservation_id = next((r for r in ("HATHAT", "HATHAU", "HATHAV") if r not in self.db.reservations), None)
        if reservation_id is None:
            raise ValueError("Too many reservations")
        reservation = Reservation(
            reservation_id=reservation_id, user_id=user_id, origin=origin, destination=destination,
            flight_type=flight_type, cabin=cabin, flights=[], passengers=deepcopy(passengers),
            payment_history=deepcopy(payment_methods), created_at=NOW, total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages, insurance=insurance,
        )
        total_price = 0
        booked = []
        for info in flights:
            flight = self._flight(info.flight_number)
            status = self._flight_instance(info.flight_number, info.date)
            if not isinstance(status, FlightDateStatusAvailable):
                raise ValueError(f"Flight {info.flight_number} not available on date {info.date}")
            if status.available_seats[cabin] < len(passengers):
                raise ValueError(f"Not enough seats on flight {info.flight_number}")
            price = status.prices[cabin]
            reservation.flights.append(ReservationFlight(origin=flight.origin, destination=flight.destination,
                                                         flight_number=info.flight_number, date=info.date, price=price))
            booked.append(status)
            total_price += price * len(passengers)
        if insurance == "yes":
            total_price += 30 * len(passengers)
        total_price += 50 * nonfree_baggages
        for payment in payment_methods:
            if payment.payment_id not in user.payment_methods:
                raise ValueError(f"Payment method {payment.payment_id} not found")
            method = user.payment_methods[payment.payment_id]
            if method.source in {"gift_card", "certificate"} and method.amount < payment.amount:
                raise ValueError(f"Not enough balance in payment method {payment.payment_id}")
        total_payment = sum(payment.amount for payment in payment_methods)
        if total_payment != total_price:
            raise ValueError(
                f"Payment amount does not add up, total price is {total_price}, but paid {total_payment}"
            )
        for payment in payment_methods:
            method = user.payment_methods[payment.payment_id]
            if method.source == "gift_card":
                method.amount -= payment.amount
            elif method.source == "certificate":
                user.payment_methods.pop(payment.payment_id)
        for status in booked:
            status.available_seats[cabin] -= len(passengers)
        self.db.reservations[reservation_id] = reservation
        self.db.users[user_id].reservations.append(reservation_id)
        return reservation

    @tool(ToolKind.GENERIC)
    def calculate(self, expression: str) -> str:
        """Calculate the result of a mathematical expression.

        Args:
            expression: The mathematical expression to calculate, such as '2 + 2'. The expression can contain numbers, operators (+, -, *, /), parentheses, and spaces.
        """
        return calculate_expression(expression)

    @tool(ToolKind.WRITE)
    def cancel_reservation(self, reservation_id: str) -> Reservation:
        """Cancel the whole reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
        """
        reservation = self._reservation(reservation_id)
        refunds = [Payment(payment_id=p.payment_id, amount=-p.amount) for p in reservation.payment_history]
        reservation.payment_history.extend(refunds)
        reservation.status = "cancelled"
        return reservation  # tau2 does not release the seats

    @tool(ToolKind.READ)
    def get_reservation_details(self, reservation_id: str) -> Reservation:
        """Get the details of a reservation.

        Args:
            reservation_id: The reservation ID, such as '8JX2WO'.
        """
        return self._reservation(reservation_id)

    @tool(ToolKind.READ)
    def get_user_details(self, user_id: str) -> User:
        """Get the details of a user, including their reservations.

        Args:
            user_id: The user ID, such as 'sara_doe_496'.
        """
        return self._user(user_id)

    @tool(ToolKind.READ)
    def list_all_airports(self) -> list[AirportCode]:
        """Returns a list of all available airports."""
        return [AirportCode(iata=iata, city=city) for iata, city in AIRPORTS]

    @tool(ToolKind.READ)
    def search_direct_flight(self, origin: str, destination: str, date: str) -> list[DirectFlight]:
        """Search for direct flights between two cities on a specific date.

        Args:
            origin: The origin city airport in three letters, such as 'JFK'.
            destination: The destination city airport in three letters, such as 'LAX'.
            date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'.
        """
        return self._search(date, origin, destination)

    @tool(ToolKind.READ)
    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list[list[DirectFlight]]:
        """Search for one-stop flights between two cities on a specific date.

        Args:
            origin: The origin city airport in three letters, such as 'JFK'.
            destination: The destination city airport in three letters, such as 'LAX'.
            date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.
        """
        results = []
        for first in self._search(date, origin, None):
            first.date = date
            # tau2: a first leg arriving "+1" makes the second leg's date the next day of May 2024
            date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first.scheduled_arrival_time_est else date
            for second in self._search(date2, first.destination, destination, first.scheduled_arrival_time_est):
                second.date = date2
                results.append([first, second])
        return results

    @tool(ToolKind.WRITE)
    def send_certificate(self, user_id: str, amount: int) -> str:
        """Send a certificate to a user. Be careful!

        Args:
            user_id: The ID of the user to book the reservation, such as 'sara_doe_496'.
            amount: The amount of the certificate to send.
        """
        user = self._user(user_id)
        for payment_id in ("certificate_3221322", "certificate_3221323", "certificate_3221324"):
            if payment_id not in user.payment_methods:
                user.payment_methods[payment_id] = Certificate(id=payment_id, amount=amount, source="certificate")
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ValueError("Too many certificates")

    @tool(ToolKind.GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of the user's issue.
        Only transfer if
         -  the user explicitly asks for a human agent
         -  given the policy and the available tools, you cannot solve the user's issue.

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"

    @tool(ToolKind.WRITE)
    def update_reservation_baggages(
        self, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
    ) -> Reservation:
        """Update the baggage information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'
            total_baggages: The updated total number of baggage items included in the reservation.
            nonfree_baggages: The updated number of non-free baggage items included in the reservation.
            payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.
        """
        reservation = self._reservation(reservation_id)
        user = self._user(reservation.user_id)
        total_price = 50 * max(0, nonfree_baggages - reservation.nonfree_baggages)
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.total_baggages = total_baggages
        reservation.nonfree_baggages = nonfree_baggages
        return reservation

    @tool(ToolKind.WRITE)
    def update_reservation_flights(
        self, reservation_id: str, cabin: CabinClass, flights: list[FlightInfo | dict], payment_id: str
    ) -> Reservation:
        """Update the flight information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            cabin: The cabin class of the reservation
            flights: An array of objects containing details about each piece of flight in the ENTIRE new reservation. Even if the a flight segment is not changed, it should still be included in the array.
            payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.
        """
        flights = _models(flights, FlightInfo)
        reservation = self._reservation(reservation_id)
        user = self._user(reservation.user_id)
        total_price = 0
        new_flights = []
        for info in flights:
            kept = next((f for f in reservation.flights if f.flight_number == info.flight_number
                         and f.date == info.date and cabin == reservation.cabin), None)
            if kept:
                total_price += kept.price * len(reservation.passengers)
                new_flights.append(kept)
                continue
            flight = self._flight(info.flight_number)
            status = self._flight_instance(info.flight_number, info.date)
            if not isinstance(status, FlightDateStatusAvailable):
                raise ValueError(f"Flight {info.flight_number} not available on date {info.date}")
            if status.available_seats[cabin] < len(reservation.passengers):
                raise ValueError(f"Not enough seats on flight {info.flight_number}")
            segment = ReservationFlight(flight_number=info.flight_number, date=info.date, price=status.prices[cabin],
                                        origin=flight.origin, destination=flight.destination)
            total_price += segment.price * len(reservation.passengers)
            new_flights.append(segment)
        total_price -= sum(f.price for f in reservation.flights) * len(reservation.passengers)
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.flights = new_flights
        reservation.cabin = cabin
        return reservation  # tau2 does not update the flights' seats here

    @tool(ToolKind.WRITE)
    def update_reservation_passengers(self, reservation_id: str, passengers: list[Passenger | dict]) -> Reservation:
        """Update the passenger information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            passengers: An array of objects containing details about each passenger.
        """
        passengers = _models(passengers, Passenger)
        reservation = self._reservation(reservation_id)
        if len(passengers) != len(reservation.passengers):
            raise ValueError("Number of passengers does not match")
        reservation.passengers = deepcopy(passengers)
        return reservation

    @tool(ToolKind.READ)
    def get_flight_status(self, flight_number: str, date: str) -> str:
        """Get the status of a flight.

        Args:
            flight_number: The flight number.
            date: The date of the flight.
        """
        return self._flight_instance(flight_number, date).status
