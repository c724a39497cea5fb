from zab.actions import PersistEpoch, Send
from zab.log_writer import coalesce_acks, send_acks
from zab.messages import Ack, AckNewLeader, Ping


def test_only_the_highest_ack_per_peer_survives_a_group_commit_and_order_is_kept():
    actions = [Send(3, Ack(1)), Send(1, Ack(1)), PersistEpoch(current=2), Send(3, AckNewLeader(2)),
               Send(3, Ack(2)), Send(1, Ack(2)), Send(3, Ack(3)), Send(2, Ping())]
    assert coalesce_acks(actions) == [PersistEpoch(current=2), Send(3, AckNewLeader(2)), Send(1, Ack(2)),
                                      Send(3, Ack(3)), Send(2, Ping())]


def test_nothing_to_coalesce_is_returned_as_is():
    actions = [Send(3, Ack(1)), Send(1, Ack(1))]
    assert coalesce_acks(actions) is actions


def test_only_ack_only_batches_may_be_sent_from_the_writers_thread():
    assert send_acks([Send(1, Ack(5))])
    assert send_acks([Send(1, Ack(5)), Send(2, Ack(5))])
    assert not send_acks([Send(1, AckNewLeader(2))])  # synchronization: the trio thread sends it, in order
    assert not send_acks([Send(1, Ack(5)), PersistEpoch(current=2)])
