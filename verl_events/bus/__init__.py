"""The bus: emitting stages, dispatching them to observers, and the observer base class."""
