"""Synthetic DBBench-style tasks (`--env sql --env-opt generate=N`): training data that never touches
the benchmark's test set.

Each task is one table from a built-in template (products, employees, sports results, books, cities)
with random rows, a question, its gold SQL (MySQL syntax that SQLite also runs: backticks, `col + 0`
for numbers stored as TEXT), and the answer obtained by RUNNING that gold SQL on SQLite: the `label` for
SELECT-style questions, the MD5 table hash for INSERT/UPDATE/DELETE. Categories cycle in a fixed order,
so any prefix of a split covers all of them; task i of a split depends only on (seed, split, i).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from turnforge.envs.sql.backends import SQLiteBackend
from turnforge.envs.sql.data import Table

GENERATED_CATEGORIES = (
    "other", "counting", "comparison", "ranking",
    "aggregation-SUM", "aggregation-MIN", "aggregation-MAX", "aggregation-AVG",
    "INSERT", "UPDATE", "DELETE",
)
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Template:
    """A table kind: its key column (unique names), a grouping column, numeric columns and their ranges."""

    names: tuple[str, ...]
    entity: str
    key: str
    key_values: tuple[str, ...]
    group: str
    group_values: tuple[str, ...]
    numbers: tuple[tuple[str, int, int], ...]


TEMPLATES = (
    Template(("Products", "Store Inventory", "product_catalog"), "product", "Name",
             ("Desk Lamp", "Office Chair", "Notebook", "Stapler", "Monitor", "Keyboard", "Mouse Pad", "Backpack",
              "Water Bottle", "Headphones", "Phone Case", "Charger", "Bookshelf", "Printer", "Webcam", "Calendar"),
             "Category", ("Office", "Electronics", "Furniture", "Accessories"),
             (("Price", 5, 400), ("Stock", 0, 120))),
    Template(("Employees", "Staff Directory", "employee_records"), "employee", "Employee",
             ("Alice Martin", "Bruno Silva", "Chen Wei", "Dana Cohen", "Elif Kaya", "Farid Haddad", "Grace Kim",
              "Hugo Lefevre", "Ines Moreau", "Jonas Berg", "Kavya Rao", "Liam Walsh", "Mia Novak", "Noah Fischer"),
             "Department", ("Sales", "Engineering", "Finance", "Support"),
             (("Salary", 30000, 120000), ("Hire Year", 2001, 2023))),
    Template(("Season Results", "League Table", "sports_results"), "team", "Team",
             ("Red Lions", "Blue Sharks", "Green Hawks", "Iron Wolves", "Golden Eagles", "Silver Foxes",
              "Black Bears", "White Tigers", "Storm Riders", "River Kings", "Mountain Goats", "Desert Owls"),
             "Division", ("North", "South", "East", "West"),
             (("Wins", 0, 30), ("Losses", 0, 30), ("Points", 0, 90))),
    Template(("Books", "Library Catalog", "book_list"), "book", "Title",
             ("Silent Rivers", "The Glass Tower", "Northern Lights", "A Quiet Year", "Paper Moons", "Lost Harbor",
              "The Long Road", "Winter Garden", "Blue Horizon", "Hidden Paths", "Open Skies", "Stone Bridges"),
             "Genre", ("Fiction", "History", "Science", "Poetry"),
             (("Pages", 80, 900), ("Year", 1950, 2023))),
    Template(("Cities", "City Statistics", "city_data"), "city", "City",
             ("Avalon", "Brookfield", "Cedar Falls", "Dunmore", "Eastwick", "Fairview", "Glenrock", "Harborview",
              "Ironwood", "Juniper", "Kingsport", "Lakeside", "Maplewood", "Northgate"),
             "Region", ("Coastal", "Inland", "Highland", "Valley"),
             (("Population", 1000, 900000), ("Area", 5, 900))),
)


def _bt(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _sq(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def make_table(template: Template, rng: random.Random) -> Table:
    """6-12 rows with distinct keys; every value is text, as in DBBench."""
    keys = rng.sample(template.key_values, rng.randint(6, min(12, len(template.key_values))))
    columns = [template.key, template.group] + [n for n, _, _ in template.numbers]
    rows = [[k, rng.choice(template.group_values)] + [str(rng.randint(lo, hi)) for _, lo, hi in template.numbers]
            for k in keys]
    return Table(rng.choice(template.names), columns, rows)


def _question(cat: str, t: Template, table: Table, rng: random.Random) -> tuple[str, str] | None:
    """(question, gold SQL) of category `cat`, or None when this table cannot give a well-posed one."""
    name, rows = _bt(table.name), table.rows
    num, num_i = rng.choice([(n, i) for i, (n, _, _) in enumerate(t.numbers, start=2)])
    row = rng.choice(rows)
    group = row[1]
    if cat == "other":
        return (f"What is the {num} of the {t.entity} {row[0]}?",
                f"SELECT {_bt(num)} FROM {name} WHERE {_bt(t.key)} = {_sq(row[0])};")
    if cat == "counting":
        return (f"How many {t.entity}s have {t.group} {group}?",
                f"SELECT COUNT(*) FROM {name} WHERE {_bt(t.group)} = {_sq(group)};")
    if cat == "comparison":
        x = rng.choice(rows)[num_i]
        return (f"Which {t.entity}s have a {num} greater than {x}?",
                f"SELECT {_bt(t.key)} FROM {name} WHERE {_bt(num)} + 0 > {x};")
    if cat == "ranking":
        top = sorted((int(r[num_i]) for r in rows), reverse=True)
        if len(top) > 1 and top[0] == top[1]:
            return None  # a tie: the question would have two answers
        return (f"Which {t.entity} has the highest {num}?",
                f"SELECT {_bt(t.key)} FROM {name} ORDER BY {_bt(num)} + 0 DESC LIMIT 1;")
    if cat.startswith("aggregation-"):
        fn = cat.split("-")[1]
        words = {"SUM": "total", "MIN": "lowest", "MAX": "highest", "AVG": "average"}[fn]
        if fn == "AVG":
            values = [int(r[num_i]) for r in rows if r[1] == group]
            if (sum(values) * 4) % len(values):
                return None  # keep averages exact in binary (x.0, x.25, x.5, x.75)
        return (f"What is the {words} {num} of the {t.entity}s with {t.group} {group}?",
                f"SELECT {fn}({_bt(num)} + 0) FROM {name} WHERE {_bt(t.group)} = {_sq(group)};")
    return _mutation(cat, t, table, rng, row, num, num_i)


def _mutation(cat: str, t: Template, table: Table, rng: random.Random, row: list, num: str, num_i: int):
    name = _bt(table.name)
    if cat == "INSERT":
        new = [k for k in t.key_values if k not in {r[0] for r in table.rows}]
        if not new:
            return None
        values = [rng.choice(new), rng.choice(t.group_values)] + [str(rng.randint(lo, hi)) for _, lo, hi in t.numbers]
        pairs = ", ".join(f"{c} {v}" for c, v in zip(table.columns, values, strict=True))
        cols = ", ".join(_bt(c) for c in table.columns)
        return (f"Add a new {t.entity} to the table with {pairs}.",
                f"INSERT INTO {name} ({cols}) VALUES ({', '.join(_sq(v) for v in values)});")
    if cat == "UPDATE":
        value = str(int(row[num_i]) + rng.randint(1, 9))
        return (f"Change the {num} of the {t.entity} {row[0]} to {value}.",
                f"UPDATE {name} SET {_bt(num)} = {_sq(value)} WHERE {_bt(t.key)} = {_sq(row[0])};")
    if cat == "DELETE":
        return (f"Delete every {t.entity} whose {t.group} is {row[1]}.",
                f"DELETE FROM {name} WHERE {_bt(t.group)} = {_sq(row[1])};")
    raise ValueError(f"unknown category {cat!r}")


def _answer(table: Table, gold: str, mutation: bool) -> tuple[list[str], str | None]:
    """(label, answer_md5) by running `gold` on a fresh SQLite copy of the table."""
    db = SQLiteBackend()
    db.create(table)
    result = db.execute(gold)
    if not result.ok:
        raise RuntimeError(f"generated gold SQL failed: {gold} ({result.error})")
    if mutation:
        answer_md5 = db.table_hash(table)
        db.close()
        return [gold], answer_md5
    db.close()
    return [str(v) for r in result.rows for v in r], None


def generate_task_data(category: str, rng: random.Random) -> dict[str, Any]:
    """The Task.data (same keys as a loaded DBBench task) of one generated task of `category`."""
    while True:
        template = rng.choice(TEMPLATES)
        table = make_table(template, rng)
        qa = _question(category, template, table, rng)
        if qa is None:
            continue
        question, gold = qa
        mutation = category in ("INSERT", "UPDATE", "DELETE")
        label, answer_md5 = _answer(table, gold, mutation)
        if not mutation and not label:
            continue  # an empty answer set teaches nothing
        headers = ",".join(table.columns)
        return {
            "question": question,
            "add_description": f"The name of this table is {table.name}, and the headers of this table are {headers}.",
            "type": category,
            "table": table.to_dict(),
            "label": label,
            "answer_md5": answer_md5,
            "gold_sql": gold,
            "source": f"turnforge-generator/{template.entity}",
        }


def generate_tasks(split: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` task payloads of `split`; task i has category i mod 11 and its own RNG."""
    if split not in SPLITS:
        raise ValueError(f"generated sql tasks have splits {', '.join(SPLITS)}, not {split!r}")
    out = []
    for i in range(n):
        category = GENERATED_CATEGORIES[i % len(GENERATED_CATEGORIES)]
        # A string seed is hashed with SHA-512 by `random`: stable across processes and Python versions.
        out.append(generate_task_data(category, random.Random(f"{seed}/{split}/{i}")))
    return out
