"""What the Spark estimators share: params, stores, the backend, the data path and ML persistence."""
