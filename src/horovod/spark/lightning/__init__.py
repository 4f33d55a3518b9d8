"""Lightning on Spark ML: ``TorchEstimator`` trains a ``lightning.LightningModule`` with Horovod (a Lightning
Trainer on every rank), ``TorchModel`` predicts."""
from horovod.spark.lightning.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
