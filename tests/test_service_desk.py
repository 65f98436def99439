"""The built-in desk domain: its DB, tools (the limits they enforce), tasks and split; a tasks file option."""

from __future__ import annotations

import json

from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.service.domain import load_domain


def _tools():
    domain = load_domain("desk")
    return domain, domain.toolkit(domain.new_db())


def test_desk_has_forty_eight_tasks_split_train_test_and_ten_tools():
    domain = load_domain("desk")
    assert len(domain.tasks) == 48 and len(domain.splits["train"]) == 36 and len(domain.splits["test"]) == 12
    assert not set(domain.splits["train"]) & set(domain.splits["test"])
    kinds = domain.tool_kinds()
    assert len(kinds) == 10 and sum(k == "write" for k in kinds.values()) == 4
    assert all(not domain.gold(t).errors for t in domain.tasks)  # every gold action succeeds


def test_booking_limits():
    domain, tools = _tools()
    db = domain.shared.model
    patient = next(p for p in db.patients.values() if p.insurance is not None and not p.appointments)
    refusing = next(d for d in db.doctors.values() if patient.insurance not in d.accepted_insurance)
    date = "2025-03-18"
    time = refusing.free_slots[date][0]
    result = tools.call("book_appointment", {"patient_id": patient.patient_id, "doctor_id": refusing.doctor_id,
                                             "date": date, "time": time, "reason": "check-up"})
    assert result.error and result.content == f"Error: {refusing.name} does not accept {patient.insurance}"
    doctor = next(d for d in db.doctors.values() if patient.insurance in d.accepted_insurance)
    slots = doctor.free_slots[date][:4]
    for i, slot in enumerate(slots):
        result = tools.call("book_appointment", {"patient_id": patient.patient_id, "doctor_id": doctor.doctor_id,
                                                 "date": date, "time": slot, "reason": "check-up"})
        assert result.error == (i == 3), result.content
    assert result.content == "Error: Patient already has 3 scheduled appointments"
    taken = tools.call("get_doctor_availability", {"doctor_id": doctor.doctor_id, "date": date})
    assert json.loads(taken.content) == doctor.free_slots[date][3:]  # the shared DB still has them all


def test_cancel_and_reschedule_free_and_take_slots():
    domain, tools = _tools()
    db = domain.shared.model
    appointment = db.appointments["A0001"]
    assert tools.call("cancel_appointment", {"appointment_id": "A0001", "reason": "bored"}).content == "Error: Invalid reason"
    assert not tools.call("cancel_appointment", {"appointment_id": "A0001", "reason": "other"}).error
    assert appointment.time in tools.db.doctors[appointment.doctor_id].free_slots[appointment.date]
    again = tools.call("cancel_appointment", {"appointment_id": "A0001", "reason": "other"})
    assert again.content == "Error: Only a scheduled appointment can be cancelled"
    second = db.appointments["A0002"]
    busy = tools.call("reschedule_appointment", {"appointment_id": "A0002", "date": second.date, "time": "23:00"})
    assert busy.error and "has no free slot" in busy.content
    assert tools.call("update_patient_contact", {"patient_id": "P0001", "phone": "1", "email": "x"}).content == \
        "Error: Invalid email"


def test_tasks_file_replaces_the_tasks_in_every_split(tmp_path):
    domain = load_domain("desk")
    picked = [domain.tasks["book_0"], domain.tasks["refuse_1"]]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(picked))
    for split in ("train", "test"):
        tasks = load_tasks("service", split, domain="desk", tasks=str(path))
        assert [t.id for t in tasks] == ["book_0", "refuse_1"]
    env = make_env("service", domain="desk", tasks=str(path))
    messages = env.reset(tasks[0])
    assert messages[-1].role == "user" and "book" in messages[-1].content
