"""The desk DB: a clinic front desk's patients, doctors (with their free slots) and appointments."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class PatientName(BaseModel):
    first_name: str
    last_name: str


class Patient(BaseModel):
    patient_id: str
    name: PatientName
    dob: str
    phone: str
    email: str
    insurance: str | None
    appointments: list[str]


class Doctor(BaseModel):
    doctor_id: str
    name: str
    specialty: str
    accepted_insurance: list[str]
    free_slots: dict[str, list[str]]
    """date (YYYY-MM-DD) -> free times (HH:MM), in order."""


class Appointment(BaseModel):
    appointment_id: str
    patient_id: str
    doctor_id: str
    date: str
    time: str
    reason: str
    status: Literal["scheduled", "cancelled"]
    cancel_reason: str | None = None


class DeskDB(BaseModel):
    model_config = ConfigDict(extra="forbid")

    patients: dict[str, Patient]
    doctors: dict[str, Doctor]
    appointments: dict[str, Appointment]
