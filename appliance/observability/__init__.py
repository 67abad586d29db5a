"""Operations taps: metrics, structured logs, the audit trail. They observe; they never decide."""
