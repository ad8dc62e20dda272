import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

extension OwnedPartitions {
    /// After a batch is committed: the batch records of its partitions (offsets, marks, dedupe entries). Made at
    /// the commit, whenever they are written: the marks must be this batch's (a later batch's marks may lie past
    /// outputs that a new owner, restoring only this record, must read back).
    func batchStateRecords(
        previous: [TopicPartition: Int64], offsets: [TopicPartition: Int64], batch: ProcessedBatch, processedAtMs: Int64
    ) throws(StateError) -> [PartitionStateRecord] {
        guard let fleet else { return [] }
        var emails: [Int32: [String]] = [:]
        for (email, partition) in zip(batch.processedEmails, batch.processedEmailPartitions) {
            emails[partition, default: []].append(email)
        }
        let marks = PartitionStateRecord.encodeMarks(try store.outputMarks())
        var records: [PartitionStateRecord] = []
        for (eventPartition, offset) in offsets.sorted(by: { $0.key < $1.key }) {
            guard let epoch = fleet.leases.epoch(of: eventPartition.partition), let from = previous[eventPartition] else { continue }
            records.append(
                PartitionStateRecord.batch(
                    topic: eventPartition.topic, partition: eventPartition.partition, epoch: epoch, owner: fleet.instanceId,
                    from: from, offset: offset, marks: marks, processedAtMs: processedAtMs, emails: emails[eventPartition.partition] ?? []))
        }
        return records
    }

    /// Starts writing a committed batch's state records, while the next batch is delivered: they take a
    /// produce round trip per partition, which would otherwise stand between every two batches.
    func publishBatchState(_ records: [PartitionStateRecord]) {
        fleet?.statePublisher.submit(records)
    }

    /// Waits until the batch records submitted have been written (or given up on): before anything that must
    /// follow them in the state topic (a release, a claim, leaving the group, giving a partition up).
    func settleStatePublish() async {
        await fleet?.statePublisher.settle()
    }
}
