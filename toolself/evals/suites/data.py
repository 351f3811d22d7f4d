"""builtin:data — questions answered by computing over CSV, JSON and XLSX files.

Each task gets its own small files in the workspace (orders with regions, products, stores
and prices) and one question whose exact integer answer needs reading the files and a filter,
a join or an aggregate, i.e. running code. The generator keeps the code that computes the
answer (`metadata["solution_code"]`) and a plausible wrong version (`metadata["wrong_code"]`:
a missing filter or the wrong column), which the expert teacher runs through the real Python
tool.

Knobs: `rows=N` (orders per file, default 24).
"""

from __future__ import annotations

import csv
import io
import json
import random
from typing import Any

from toolself.evals.suites.common import (
    CATEGORIES, DEFAULT_SIZES, MONTHS, PLACE_HEADS, PLACE_TAILS, PRODUCTS, REGIONS, check_split, knob_int,
    reject_unknown, rng_for, split_part,
)
from toolself.evals.task import Task

VARIANTS = ("filter_sum", "join_revenue", "xlsx_join", "count_threshold", "price_spread")


def csv_text(header: list[str], rows: list[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def xlsx_bytes(sheet: str, header: list[str], rows: list[list[Any]]) -> bytes:
    try:
        from openpyxl import Workbook
    except ImportError as exc:
        raise RuntimeError("builtin:data writes XLSX files with openpyxl: pip install 'toolself[tools]'") from exc

    book = Workbook()
    ws = book.active
    ws.title = sheet
    ws.append(header)
    for row in rows:
        ws.append(row)
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


READ_SALES = "import csv\nrows = list(csv.DictReader(open('sales.csv', newline='')))\n"


def _orders(rng: random.Random, rows: int, products: list[str], regions: list[str]) -> list[list[Any]]:
    prices = {p: rng.randrange(3, 60) for p in products}
    out = []
    for i in range(rows):
        product = rng.choice(products)
        out.append([1001 + i, rng.choice(regions), product, rng.choice(MONTHS), rng.randrange(1, 20),
                    prices[product] + rng.choice([0, 0, 1, -1])])
    return out


def make_data_task(rng: random.Random, split: str, variant: str, rows: int) -> dict[str, Any]:
    """Files, question, answer and the code that computes it, for one variant."""
    products = rng.sample(split_part(PRODUCTS, split), 6)
    regions = rng.sample(split_part(REGIONS, split), 4)
    header = ["order_id", "region", "product", "month", "units", "unit_price"]
    orders = _orders(rng, rows, products, regions)
    files: dict[str, str | bytes] = {}
    inspect = ["sales.csv"]
    if variant == "filter_sum":
        product, region = rng.choice(orders)[2], rng.choice(regions)
        files["sales.csv"] = csv_text(header, orders)
        answer = sum(r[4] for r in orders if r[2] == product and r[1] == region)
        question = (f'In sales.csv, how many units of "{product}" were sold in the {region} region in total? '
                    "Answer with a number.")
        code = READ_SALES + (f"print(sum(int(r['units']) for r in rows if r['product'] == {product!r} "
                             f"and r['region'] == {region!r}))")
        wrong = READ_SALES + f"print(sum(int(r['units']) for r in rows if r['product'] == {product!r}))"
        params = {"product": product, "region": region}
    elif variant == "join_revenue":
        categories = rng.sample(split_part(CATEGORIES, split), 3)
        category_of = {p: rng.choice(categories) for p in products}
        category = category_of[rng.choice(orders)[2]]
        files["sales.csv"] = csv_text(header, orders)
        files["products.json"] = json.dumps([{"product": p, "category": c} for p, c in category_of.items()], indent=1)
        inspect.append("products.json")
        answer = sum(r[4] * r[5] for r in orders if category_of[r[2]] == category)
        question = (f'Using sales.csv and products.json, what is the total revenue (units times unit_price) of all '
                    f'orders of products in the "{category}" category? Answer with a number.')
        code = READ_SALES + ("import json\ncategory = {p['product']: p['category'] for p in json.load(open('products.json'))}\n"
                             f"print(sum(int(r['units']) * int(r['unit_price']) for r in rows "
                             f"if category[r['product']] == {category!r}))")
        wrong = READ_SALES + ("import json\ncategory = {p['product']: p['category'] for p in json.load(open('products.json'))}\n"
                              f"print(sum(int(r['units']) for r in rows if category[r['product']] == {category!r}))")
        params = {"category": category}
    elif variant == "xlsx_join":
        cities = rng.sample([h + t for h in split_part(PLACE_HEADS, split) for t in PLACE_TAILS], 3)
        stores = [[f"S{n}", rng.choice(cities), f"manager {n}"] for n in range(1, 7)]
        city = rng.choice([s[1] for s in stores])
        store_header = ["order_id", "store_id", "product", "month", "units", "unit_price"]
        store_orders = [[r[0], rng.choice(stores)[0], *r[2:]] for r in orders]
        files["sales.csv"] = csv_text(store_header, store_orders)
        files["stores.xlsx"] = xlsx_bytes("stores", ["store_id", "city", "manager"], stores)
        inspect.append("stores.xlsx")
        city_of = {s[0]: s[1] for s in stores}
        answer = sum(r[4] for r in store_orders if city_of[r[1]] == city)
        question = (f"Using sales.csv and stores.xlsx, how many units in total were sold by stores located in "
                    f"{city}? Answer with a number.")
        read_stores = ("from openpyxl import load_workbook\n"
                       "sheet = load_workbook('stores.xlsx').active\n"
                       "city = {row[0]: row[1] for row in sheet.iter_rows(min_row=2, values_only=True)}\n")
        code = READ_SALES + read_stores + (f"print(sum(int(r['units']) for r in rows "
                                           f"if city[r['store_id']] == {city!r}))")
        wrong = READ_SALES + read_stores + (f"print(sum(int(r['unit_price']) for r in rows "
                                            f"if city[r['store_id']] == {city!r}))")
        params = {"city": city}
    elif variant == "count_threshold":
        region = rng.choice(regions)
        threshold = rng.randrange(5, 15)
        keys = header
        files["orders.json"] = json.dumps([dict(zip(keys, r)) for r in orders], indent=1)
        inspect = ["orders.json"]
        answer = sum(1 for r in orders if r[1] == region and r[4] > threshold)
        question = (f"In orders.json, how many orders from the {region} region have more than {threshold} units? "
                    "Answer with a number.")
        load = "import json\norders = json.load(open('orders.json'))\n"
        code = load + f"print(sum(1 for o in orders if o['region'] == {region!r} and o['units'] > {threshold}))"
        wrong = load + f"print(sum(1 for o in orders if o['region'] == {region!r} and o['units'] >= {threshold}))"
        params = {"region": region, "threshold": threshold}
    elif variant == "price_spread":
        region = rng.choice(regions)
        files["sales.csv"] = csv_text(header, orders)
        prices = [r[5] for r in orders if r[1] == region]
        answer = max(prices) - min(prices) if prices else 0
        question = (f"In sales.csv, what is the difference between the highest and the lowest unit_price among "
                    f"orders from the {region} region? Answer with a number.")
        code = READ_SALES + (f"prices = [int(r['unit_price']) for r in rows if r['region'] == {region!r}]\n"
                             "print(max(prices) - min(prices))")
        wrong = READ_SALES + "prices = [int(r['unit_price']) for r in rows]\nprint(max(prices) - min(prices))"
        params = {"region": region}
    else:
        raise ValueError(f"unknown data variant {variant!r}")
    if answer == 0:  # a filter that matched nothing: a model that answers 0 without reading would score; draw again
        return make_data_task(rng, split, variant, rows)
    return {"files": files, "question": question, "answer": str(answer), "solution_code": code,
            "wrong_code": wrong, "inspect": inspect, "params": params}


def generate(split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
    check_split(split)
    rows = knob_int(knobs, "rows", 24, 5, 100_000)
    reject_unknown("data", knobs)
    n = DEFAULT_SIZES[split] if n is None else n
    rng = rng_for("data", split, seed, rows)
    tasks = []
    for index in range(n):
        variant = VARIANTS[index % len(VARIANTS)]
        made = make_data_task(rng, split, variant, rows)
        tasks.append(Task(
            id=f"data-{split}-{seed}-{index:04d}", question=made["question"], answer=made["answer"],
            level=1 if variant in ("filter_sum", "count_threshold", "price_spread") else 2, family="data",
            split=split, inline_files=made["files"],
            metadata={"suite": "data", "seed": seed, "variant": variant, "params": made["params"],
                      "solution_code": made["solution_code"], "wrong_code": made["wrong_code"],
                      "inspect": made["inspect"]},
        ))
    return tasks
