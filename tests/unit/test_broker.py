from streaming.tools.broker import BrokerSpec, new_cluster_id, server_properties


def test_cluster_ids_never_look_like_options():
    ids = [new_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


def test_server_properties_are_a_loopback_kraft_node(tmp_path):
    props = server_properties(BrokerSpec(home=tmp_path, jars=tmp_path, port=19092,
                                         controller_port=19093))
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["auto.create.topics.enable"] == "false"
    assert props["log.dirs"] == str(tmp_path / "data")
