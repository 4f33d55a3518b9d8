"""What watches the engine without the engine knowing it: the timeline, the stall inspector and deadlock
detector, and the autotuner. Each implements :class:`horovod.core.engine.observer.EngineObserver`."""
