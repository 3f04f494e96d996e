"""What the dashboard shows, as plain data for its templates: the thread page's timeline rows,
branch tree and state chart (`timeline`, `drawings`) and the state tree, diffs and picker
(`diffview`). Python here computes rows, coordinates, labels and classes; the templates under
templates/checkpoints/ draw the markup, with Django's autoescaping, so no text here is ever
marked safe.

It reads through the models and selectors and writes nothing; the storage engine, the API and
the live feed never import it.
"""
