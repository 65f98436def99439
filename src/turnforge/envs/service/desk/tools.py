"""The desk toolkit: 10 tools (5 READ, 4 WRITE, 1 GENERIC) over the clinic DB; limits the tools enforce raise
errors, the policy's other rules (authentication, confirmation, the 24-hour rule) are the agent's to keep."""

from __future__ import annotations

from turnforge.envs.service.desk.db import Appointment, Doctor, Patient
from turnforge.envs.service.toolkit import ToolKind, Toolkit, tool

MAX_SCHEDULED = 3
CANCEL_REASONS = ("schedule conflict", "feeling better", "other")


class DeskTools(Toolkit):
    """All the tools of the clinic front desk."""

    def _patient(self, patient_id: str) -> Patient:
        if patient_id not in self.db.patients:
            raise ValueError("Patient not found")
        return self.db.patients[patient_id]

    def _doctor(self, doctor_id: str) -> Doctor:
        if doctor_id not in self.db.doctors:
            raise ValueError("Doctor not found")
        return self.db.doctors[doctor_id]

    def _appointment(self, appointment_id: str) -> Appointment:
        if appointment_id not in self.db.appointments:
            raise ValueError("Appointment not found")
        return self.db.appointments[appointment_id]

    def _take_slot(self, doctor: Doctor, date: str, time: str) -> None:
        if time not in doctor.free_slots.get(date, []):
            raise ValueError(f"{doctor.name} has no free slot on {date} at {time}")
        doctor.free_slots[date].remove(time)

    @tool(ToolKind.READ)
    def find_patient_id(self, first_name: str, last_name: str, dob: str) -> str:
        """Find a patient's id by full name and date of birth (the patient's identity check).

        Args:
            first_name: The patient's first name, such as 'Ana'.
            last_name: The patient's last name, such as 'Silva'.
            dob: The date of birth in the format 'YYYY-MM-DD'.
        """
        for patient_id, p in self.db.patients.items():
            if (p.name.first_name.lower() == first_name.lower() and p.name.last_name.lower() == last_name.lower()
                    and p.dob == dob):
                return patient_id
        raise ValueError("Patient not found")

    @tool(ToolKind.READ)
    def get_patient_details(self, patient_id: str) -> Patient:
        """Get a patient's contact details, insurance and appointment ids.

        Args:
            patient_id: The patient id, such as 'P0001'.
        """
        return self._patient(patient_id)

    @tool(ToolKind.READ)
    def list_doctors(self, specialty: str) -> list[dict]:
        """List the doctors of a specialty with the insurance plans they accept.

        Args:
            specialty: The specialty, such as 'cardiology', 'dermatology', 'family medicine' or 'pediatrics'.
        """
        found = [{"doctor_id": d.doctor_id, "name": d.name, "accepted_insurance": d.accepted_insurance}
                 for d in self.db.doctors.values() if d.specialty == specialty.lower()]
        if not found:
            raise ValueError(f"No doctor of specialty {specialty}")
        return found

    @tool(ToolKind.READ)
    def get_doctor_availability(self, doctor_id: str, date: str) -> list[str]:
        """Get a doctor's free appointment times on a date, earliest first.

        Args:
            doctor_id: The doctor id, such as 'D01'.
            date: The date in the format 'YYYY-MM-DD'.
        """
        return list(self._doctor(doctor_id).free_slots.get(date, []))

    @tool(ToolKind.READ)
    def get_appointment_details(self, appointment_id: str) -> Appointment:
        """Get the details of an appointment.

        Args:
            appointment_id: The appointment id, such as 'A0001'.
        """
        return self._appointment(appointment_id)

    @tool(ToolKind.WRITE)
    def book_appointment(self, patient_id: str, doctor_id: str, date: str, time: str, reason: str) -> Appointment:
        """Book an appointment in a doctor's free slot. The doctor must accept the patient's insurance (patients
        without insurance pay themselves) and a patient holds at most 3 scheduled appointments. Explain the
        booking and get the patient's explicit confirmation (yes) first.

        Args:
            patient_id: The patient id, such as 'P0001'.
            doctor_id: The doctor id, such as 'D01'.
            date: The date in the format 'YYYY-MM-DD'.
            time: A free time from get_doctor_availability, such as '09:30'.
            reason: The reason for the visit, in a few words.
        """
        patient, doctor = self._patient(patient_id), self._doctor(doctor_id)
        scheduled = [a for a in patient.appointments if self.db.appointments[a].status == "scheduled"]
        if len(scheduled) >= MAX_SCHEDULED:
            raise ValueError(f"Patient already has {MAX_SCHEDULED} scheduled appointments")
        if patient.insurance is not None and patient.insurance not in doctor.accepted_insurance:
            raise ValueError(f"{doctor.name} does not accept {patient.insurance}")
        self._take_slot(doctor, date, time)
        appointment_id = f"A{len(self.db.appointments) + 1:04d}"
        appointment = Appointment(appointment_id=appointment_id, patient_id=patient_id, doctor_id=doctor_id,
                                  date=date, time=time, reason=reason, status="scheduled")
        self.db.appointments[appointment_id] = appointment
        patient.appointments.append(appointment_id)
        return appointment

    @tool(ToolKind.WRITE)
    def cancel_appointment(self, appointment_id: str, reason: str) -> Appointment:
        """Cancel a scheduled appointment and free its slot. Explain it and get the patient's explicit
        confirmation (yes) first.

        Args:
            appointment_id: The appointment id, such as 'A0001'.
            reason: One of 'schedule conflict', 'feeling better' or 'other'.
        """
        appointment = self._appointment(appointment_id)
        if appointment.status != "scheduled":
            raise ValueError("Only a scheduled appointment can be cancelled")
        if reason not in CANCEL_REASONS:
            raise ValueError("Invalid reason")
        doctor = self._doctor(appointment.doctor_id)
        slots = doctor.free_slots.setdefault(appointment.date, [])
        slots.append(appointment.time)
        slots.sort()
        appointment.status = "cancelled"
        appointment.cancel_reason = reason
        return appointment

    @tool(ToolKind.WRITE)
    def reschedule_appointment(self, appointment_id: str, date: str, time: str) -> Appointment:
        """Move a scheduled appointment to another free slot of the same doctor, freeing the old one. Explain
        it and get the patient's explicit confirmation (yes) first.

        Args:
            appointment_id: The appointment id, such as 'A0001'.
            date: The new date in the format 'YYYY-MM-DD'.
            time: A free time of the same doctor on that date, such as '14:00'.
        """
        appointment = self._appointment(appointment_id)
        if appointment.status != "scheduled":
            raise ValueError("Only a scheduled appointment can be rescheduled")
        doctor = self._doctor(appointment.doctor_id)
        self._take_slot(doctor, date, time)
        old = doctor.free_slots.setdefault(appointment.date, [])
        old.append(appointment.time)
        old.sort()
        appointment.date, appointment.time = date, time
        return appointment

    @tool(ToolKind.WRITE)
    def update_patient_contact(self, patient_id: str, phone: str, email: str) -> Patient:
        """Update a patient's phone number and email (give both; repeat the one that does not change).

        Args:
            patient_id: The patient id, such as 'P0001'.
            phone: The phone number, such as '555-0100'.
            email: The email address.
        """
        patient = self._patient(patient_id)
        if "@" not in email:
            raise ValueError("Invalid email")
        patient.phone, patient.email = phone, email
        return patient

    @tool(ToolKind.GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the patient to a human agent, with a summary of the issue. Only transfer if the patient
        explicitly asks for a human, or the policy and tools cannot solve the issue.

        Args:
            summary: A summary of the patient's issue.
        """
        return "Transfer successful"
