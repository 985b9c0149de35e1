def test_installed_functions(conn):
    names = {r[0] for r in conn.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'dq\\_%'")}
    assert {"dq_offer", "dq_offer_many", "dq_poll_many", "dq_ack", "dq_nack", "dq_extend",
            "dq_cancel", "dq_get", "dq_next_due"} <= names
    assert conn.execute("SELECT dq_offer('q', 'k', 'v')").fetchone()[0] == "created"
