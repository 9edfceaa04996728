"""The prompts speculation is measured on: text to copy (where drafts are kept) and open
questions (where few are)."""

# Long enough that a faithful copy runs past --max-tokens: the copy-heavy figure then
# measures copying, not the chat around it.
PASSAGE = (
    "The lighthouse stood at the edge of the cliff for two hundred years. Every night its "
    "keeper climbed the ninety steps, trimmed the wick, and watched the ships pass safely "
    "through the narrow channel below. In winter the storms came from the north, and the "
    "waves broke so high against the rocks that the spray reached the windows of the lamp "
    "room. The keeper kept a logbook on the table by the stairs, and in it he wrote the name "
    "of every ship, the hour it passed, and the state of the sea. When the keeper grew old, "
    "his daughter learned to tend the light, and she kept the logbook in the same careful "
    "hand. Years later, when the light was finally automated, the logbooks were carried down "
    "the ninety steps and placed in the town library, where visitors still read them on "
    "rainy afternoons."
)
CODE = """def summarize(orders):
    totals = {}
    counts = {}
    for order in orders:
        customer = order.customer
        amount = order.price * order.quantity
        if order.discount:
            amount -= amount * order.discount
        totals[customer] = totals.get(customer, 0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    report = []
    for customer, total in sorted(totals.items()):
        average = total / counts[customer]
        report.append(f"{customer}: {total:.2f} ({counts[customer]} orders, avg {average:.2f})")
    return "\\n".join(report)
"""
WORKLOADS = {
    "copy-heavy": [
        f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}",
        f"Rewrite this function, renaming `orders` to `purchases`, and change nothing else:\n\n{CODE}",
        f"Copy this text and replace 'lighthouse' with 'tower':\n\n{PASSAGE}",
        f"Quote this code back to me unchanged:\n\n{CODE}",
    ],
    "open-ended": [
        "Write a short story about a dragon who learns to bake.",
        "Explain why the sky is blue.",
        "Give me five ideas for a birthday party.",
        "Describe a walk through a forest in autumn.",
    ],
}
